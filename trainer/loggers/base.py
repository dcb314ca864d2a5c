"""The logger interface: three methods, like Lightning Fabric's."""

from __future__ import annotations

from typing import Any, Mapping


class Logger:
    """A metric sink. The trainer builds loggers on rank 0 only and calls, in this order:

    ``log_hyperparams(config)`` once (when the run has a config or the module saved hyperparameters:
    the config with them under "hparams", or them alone), ``log_metrics(metrics, step)``
    on every logging step and after each validation (several calls may share a step), and
    ``finalize()`` once at the end, also when training failed.

    A backend built by name gets the run directory as its first argument (``Backend(run_dir,
    **options)``); options it does not accept are rejected before any worker starts.
    """

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` (name -> number) at optimizer step ``step``."""
        raise NotImplementedError

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        """Record the run's resolved configuration (default: ignore). Implementations write it
        through :func:`trainer.loggers.redact_secrets`."""

    def finalize(self) -> None:
        """Flush and close (default: nothing to do)."""
