"""The command line: Hydra's ``train.py`` (``hydra_app.py``), config errors as one line
(``errors.py``) and secrets kept out of Hydra's files (``redact_files.py``)."""

from trainer.cli.hydra_app import build, main, prepare, run_job

__all__ = ["build", "main", "prepare", "run_job"]
