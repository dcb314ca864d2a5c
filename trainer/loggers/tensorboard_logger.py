"""TensorBoard event files (``tensorboard --logdir <run_dir>``)."""

from __future__ import annotations

import json
from typing import Any, Mapping

from trainer.loggers.base import Logger
from trainer.runtime.redact import redact_secrets


class TensorBoardLogger(Logger):
    """Scalars in one event file in the run directory; the config as a text summary named
    ``config`` and in the HPARAMS tab (secrets redacted). TensorBoard is imported here, only when this logger is used.

    Args:
        run_dir: the directory the event file goes to.
        flush_secs: write pending events to disk at least this often.
        max_queue: events buffered before a write.
        log_dir: the directory for the event file instead of ``run_dir`` (null: ``run_dir``; a DeepSpeed
            config's ``tensorboard.output_path/job_name``).
    """

    def __init__(self, run_dir: str, flush_secs: int = 30, max_queue: int = 10, log_dir: str | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=log_dir or run_dir, flush_secs=flush_secs, max_queue=max_queue)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self._writer.add_scalar(name, value, global_step=step)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        redacted = redact_secrets(dict(params))
        text = json.dumps(redacted, indent=2, default=str)
        self._writer.add_text("config", "```\n" + text + "\n```")
        # Also TensorBoard's HPARAMS tab (as Lightning): flat "a/b" names, scalar values.
        from torch.utils.tensorboard.summary import hparams

        for summary in hparams(_flatten(redacted), {}):
            self._writer.file_writer.add_summary(summary)

    def finalize(self) -> None:
        self._writer.close()


def _flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as ``{"a/b": value}``; values other than numbers, strings and bools as text."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten(value, name + "/"))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = json.dumps(value, default=str)
    return flat
