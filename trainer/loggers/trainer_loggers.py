"""Lightning's ``trainer.loggers`` / ``trainer.logger``: the Logger objects of a Trainer's run."""

from __future__ import annotations

from typing import Any

from trainer.loggers.registry import build_loggers, resolve_logger_specs


class TrainerLoggers:
    """The logger properties of ``Trainer`` (a mixin): the objects built from ``trainer.logger_specs``
    (the checked ``loggers=`` / ``logger=`` choice) for the run directory."""

    logger_specs: list
    run_dir: str

    # loggers: Logger objects built from ``logger_specs``, on every rank (only rank 0's write)
    @property
    def loggers(self) -> list[Any]:
        """The run's Logger objects (Lightning's ``trainer.loggers``): those of the current or last
        call; before any, the ones it will use. On ranks other than 0 they write nothing and their
        ``experiment`` accepts any call and does nothing."""
        return list(self.logger_objects(self.run_dir))

    @loggers.setter
    def loggers(self, value: Any) -> None:
        self.logger_specs = resolve_logger_specs(value)
        self._logger_objects = None

    @property
    def logger(self) -> Any:
        """The first of ``loggers``, or None (Lightning's ``trainer.logger``)."""
        objects = self.logger_objects(self.run_dir)
        return objects[0] if objects else None

    @logger.setter
    def logger(self, value: Any) -> None:
        self.loggers = [] if value is None else [value]

    def record_loggers(self, loggers: list[Any], run_dir: str) -> list[Any]:
        """The trainer's own record of a run: Logger objects rank 0 writes with ``loggers`` (the run's
        Logger objects) that are not among ``trainer.loggers``. None here (this Trainer's
        ``metrics.jsonl`` is the "jsonl" logger among its loggers); Lightning's Trainer keeps one."""
        return []

    def log_files_dir(self, run_dir: str) -> str | None:
        """Where rank 0 writes the trainer's own log files (``train.log`` when no other log handler is set
        up, ``flops.txt``): the run directory; None: nowhere."""
        return run_dir

    def logger_objects(self, run_dir: str) -> list[Any]:
        """The Logger objects for ``logger_specs`` writing under ``run_dir``: built once, then the same
        objects (a new run directory or a new choice builds them anew). Building writes nothing."""
        key = (run_dir, id(self.logger_specs))
        cached = self.__dict__.get("_logger_objects")
        if cached is None or cached[0] != key:
            cached = (key, build_loggers(self.logger_specs, run_dir))
            # A memo of objects that follow from the configuration (the same before, during and after a
            # run: ``trainer.logger`` is the run's logger), not run state: kept past the live-run guard.
            self.__dict__["_logger_objects"] = cached
        return cached[1]

