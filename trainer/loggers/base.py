"""The logger interface: three methods, like Lightning Fabric's, plus Lightning's attributes."""

from __future__ import annotations

from typing import Any, Mapping

from trainer.runtime import distributed


class DummyExperiment:
    """What ``logger.experiment`` is on ranks other than 0: every attribute is a method that accepts
    any arguments and does nothing, so a module's ``self.logger.experiment.add_image(...)`` runs
    unchanged on every rank (only rank 0's logger writes)."""

    def _nothing(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # pickling and copy probe dunder names: answer as a plain object
            raise AttributeError(name)
        return self._nothing

    def __getitem__(self, index: Any) -> DummyExperiment:
        return self  # ``experiment[0].add_image(...)`` (a list of experiments)

    def __setitem__(self, index: Any, value: Any) -> None:
        pass


class _NoExperiment:
    """The ``experiment`` of a backend that has none: any use is an error naming the loggers that have one."""

    def __init__(self, backend: str):
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"{self._backend} has no experiment object ({name!r} asked for); use a TensorBoardLogger "
                             "(a SummaryWriter), WandbLogger (a W&B run) or CSVLogger as the first logger")


def writes_here() -> bool:
    """Whether this process writes log files: global rank 0 (or a process outside a run)."""
    return distributed.rank() == 0


class Logger:
    """A metric sink. The trainer calls, on rank 0, in this order:

    ``log_hyperparams(config)`` once (when the run has a config or the module saved hyperparameters:
    the config with them under "hparams", or them alone), ``log_metrics(metrics, step)``
    on every logging step and after each validation (several calls may share a step), and
    ``finalize()`` once at the end, also when training failed. Every rank holds the run's logger
    objects (``trainer.loggers``, a module's ``self.loggers``); on ranks other than 0 they write
    nothing and their ``experiment`` is a `DummyExperiment`.

    A backend built by name gets the run directory as its first argument (``Backend.in_run_dir(run_dir,
    **options)``, else ``Backend(run_dir, **options)``); options it does not accept are rejected
    before any worker starts. Building a logger writes nothing: files open at the first write.

    Lightning's attributes, None where a backend has no such thing: ``name``, ``version``,
    ``save_dir``, ``log_dir``, ``experiment``.
    """

    name: Any = None
    version: Any = None
    save_dir: Any = None
    log_dir: Any = None

    @property
    def experiment(self) -> Any:
        """The backend's own object (a SummaryWriter, a W&B run, ...) on rank 0; a
        `DummyExperiment` on other ranks. A backend without one refuses any use on rank 0."""
        return _NoExperiment(type(self).__name__) if writes_here() else DummyExperiment()

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` (name -> number) at optimizer step ``step``."""
        raise NotImplementedError

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Record the run's resolved configuration (default: ignore). Implementations write it
        through `trainer.loggers.redact_secrets`."""

    def open_in_run(self) -> None:
        """Called on rank 0 when a run of the trainer opens this logger, before its first write (default:
        nothing). A backend may then hand its writes to a thread of its own (TensorBoard does)."""

    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """Lightning's hook for a model graph (default: nothing)."""

    def save(self) -> None:
        """Lightning's flush hook (default: nothing; every backend here flushes as it writes)."""

    def finalize(self, status: str = "success") -> None:
        """Flush and close at the end of the run (default: nothing to do); ``status``: "success", or "failed"
        when the run raised (Lightning's values)."""


class DummyLogger(Logger):
    """A logger that writes nothing (what ``fast_dev_run`` puts in place of the run's loggers, as
    Lightning): ``self.logger.experiment.add_image(...)`` still runs."""

    @property
    def experiment(self) -> Any:
        return DummyExperiment()

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        pass
