"""Lightning's ``EarlyStopping(monitor, min_delta, patience, verbose, mode, ...)`` over this trainer's
`EarlyStopping`: a Lightning program's positional and keyword arguments mean
here what they mean there; one whose meaning the trainer cannot give is an error naming what to use."""

from __future__ import annotations

from trainer.callbacks import EarlyStopping as _EarlyStopping


class EarlyStopping(_EarlyStopping):
    """Lightning's ``EarlyStopping``: stops when ``monitor`` (a validation metric) has not improved by
    more than ``min_delta`` for ``patience`` validations; checked at each validation's end."""

    def __init__(self, monitor: str, min_delta: float = 0.0, patience: int = 3, verbose: bool = False,
                 mode: str = "min", strict: bool = True, check_finite: bool = True,
                 stopping_threshold: float | None = None, divergence_threshold: float | None = None,
                 check_on_train_epoch_end: bool | None = None, log_rank_zero_only: bool = False):
        if divergence_threshold is not None:
            raise ValueError(f"EarlyStopping(divergence_threshold={divergence_threshold!r}) does not exist here; "
                             "use check_finite=True (stops on NaN / inf) or stopping_threshold=")
        if check_on_train_epoch_end:
            raise ValueError("EarlyStopping(check_on_train_epoch_end=True): this trainer checks at the end of each "
                             "validation only; leave it None and validate each epoch (check_val_every_n_epoch=1)")
        if not strict:
            raise ValueError("EarlyStopping(strict=False): a monitor missing from the validation metrics is always "
                             "an error here (it lists the metrics there are); log the metric, or fix its name")
        super().__init__(monitor=monitor, mode=mode, patience=patience, min_delta=min_delta,
                         check_finite=check_finite, stopping_threshold=stopping_threshold)
        self.verbose = verbose  # the reason to stop is always logged (rank 0)
