"""Lightning's ``EarlyStopping(monitor, min_delta, patience, verbose, mode, ...)`` over this trainer's
`EarlyStopping`: a Lightning program's positional and keyword arguments mean
here what they mean there; one whose meaning the trainer cannot give is an error naming what to use."""

from __future__ import annotations

from trainer.callbacks import EarlyStopping as _EarlyStopping


class EarlyStopping(_EarlyStopping):
    """Lightning's ``EarlyStopping``: stops when ``monitor`` has not improved by more than ``min_delta``
    for ``patience`` checks, at each validation's end, or with ``check_on_train_epoch_end=True`` at each
    training epoch's end (on what was logged); ``stopping_threshold`` / ``divergence_threshold`` stop at
    once; ``strict=False`` warns once about a missing monitor and skips the check."""

    def __init__(self, monitor: str, min_delta: float = 0.0, patience: int = 3, verbose: bool = False,
                 mode: str = "min", strict: bool = True, check_finite: bool = True,
                 stopping_threshold: float | None = None, divergence_threshold: float | None = None,
                 check_on_train_epoch_end: bool | None = None, log_rank_zero_only: bool = False):
        super().__init__(monitor=monitor, mode=mode, patience=patience, min_delta=min_delta,
                         check_finite=check_finite, stopping_threshold=stopping_threshold,
                         divergence_threshold=divergence_threshold, strict=strict,
                         check_on_train_epoch_end=check_on_train_epoch_end)
        self.verbose = verbose  # the reason to stop is always logged (rank 0)
