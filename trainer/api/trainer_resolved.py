"""The Trainer's values that a run resolves (the batch settings, the run directory, the wrapped model),
and the rule that keeps the Trainer a holder of configuration: nothing writes into it while a run is
live.

``trainer.batch_size`` and its siblings read the live run's resolved settings, then what the last call
resolved (stored by the facade when the call returned), then what the Trainer was configured with.
"""

from __future__ import annotations

from typing import Any

#: what a hook or callback may set on the Trainer during a run (Lightning's settable run state)
SETTABLE_DURING_RUN = frozenset({"should_stop"})


class TrainerResolvedSettings:
    """A mixin of ``Trainer``: the resolved values, read through the run view while a run is live."""

    _run_view: Any = None  # the live run's view (set by the loop's entry while a call runs on this rank)
    _live = False  # a call runs on this rank: the Trainer is read-only
    _configured_batch: Any = None  # the BatchSettings resolved from the Trainer's own arguments
    _last_batch: Any = None  # the BatchSettings the last call resolved
    _model: Any = None  # the last in-process call's wrapped module

    def __setattr__(self, name: str, value: Any) -> None:
        if self._live and name not in SETTABLE_DURING_RUN:
            raise AttributeError(
                f"trainer.{name} cannot be set while a run is live: the Trainer holds the configuration the run was "
                f"built from; give it when constructing the Trainer (or between calls), or, for a stop, set "
                f"trainer.should_stop = True")
        object.__setattr__(self, name, value)

    def _batch_settings(self) -> Any:
        view = self._run_view
        if view is not None and view.batch is not None:
            return view.batch
        return self._last_batch if self._last_batch is not None else self._configured_batch

    @property
    def batch_size(self) -> int:
        """Samples per rank per micro-batch: during and after a call as the run resolved it (the
        module's loader's when ``data.batch_size`` is unset, the batch-size finder's choice), before
        any call as configured (32 when unset)."""
        return self._batch_settings().batch_size

    @property
    def drop_last(self) -> bool:
        """Whether a short last global batch of an epoch is dropped (resolved like ``batch_size``)."""
        return self._batch_settings().drop_last

    @property
    def accumulate_grad_batches(self) -> int:
        """Micro-batches per optimizer step (resolved like ``batch_size``)."""
        return self._batch_settings().accumulate_grad_batches

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step over every data-parallel rank (resolved like ``batch_size``)."""
        return self._batch_settings().global_batch_size

    @property
    def num_workers(self) -> int:
        """The training loader's worker processes (resolved like ``batch_size``)."""
        return self._batch_settings().num_workers

    @property
    def pin_memory(self) -> bool:
        """Whether the training loader pins its batches (resolved like ``batch_size``)."""
        return self._batch_settings().pin_memory

    @property
    def run_dir(self) -> str:
        """The run directory: during a run rank 0's (the same on every rank), else the last call's or
        the configured one."""
        view = self._run_view
        if view is not None and getattr(view._run, "run_dir", None) is not None:
            return view.run_dir
        return self.__dict__["_run_dir"]

    @run_dir.setter
    def run_dir(self, value: str) -> None:
        self._run_dir = value

    @property
    def model(self) -> Any:
        """The module as the strategy wrapped it for training (e.g. ``DistributedDataParallel``; Lightning's
        ``trainer.model``): the live run's, then the last in-process call's; None before."""
        view = self._run_view
        if view is not None and getattr(view._run, "wrapped", None) is not None:
            return view._run.wrapped
        return self._model
