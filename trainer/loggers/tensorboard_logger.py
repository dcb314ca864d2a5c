"""TensorBoard event files (``tensorboard --logdir <run_dir>``)."""

from __future__ import annotations

import json
from typing import Any, Mapping

from trainer.loggers.base import Logger
from trainer.loggers.redact import redact_secrets


class TensorBoardLogger(Logger):
    """Scalars in one event file in the run directory; the config as a text summary named
    ``config`` (secrets redacted). TensorBoard is imported here, only when this logger is used.

    Args:
        run_dir: the directory the event file goes to.
        flush_secs: write pending events to disk at least this often.
        max_queue: events buffered before a write.
    """

    def __init__(self, run_dir: str, flush_secs: int = 30, max_queue: int = 10):
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=run_dir, flush_secs=flush_secs, max_queue=max_queue)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._writer.add_scalar(name, value, global_step=step)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        text = json.dumps(redact_secrets(params), indent=2, default=str)
        self._writer.add_text("config", "```\n" + text + "\n```")

    def finalize(self) -> None:
        self._writer.close()
