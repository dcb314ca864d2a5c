"""Python logging that knows its rank: INFO on rank 0, WARNING elsewhere, every line tagged.

A warning that every rank would give alike (a config or wrapping warning) goes through
``rank_zero_warn``: logged once, by rank 0 (``rank_zero_user_warning``: a Python warning instead
where the Trainer asks for Lightning's). One that only some ranks hit uses ``log.warning`` and
keeps its rank tag.

Every line goes through the secret redaction (``redact.py``) on its way to the console or
``train.log``: a message that quotes a value read from a secret environment variable shows ``***``.
"""

from __future__ import annotations

import logging
import sys
import warnings

from trainer.runtime.redact import redact_secrets

_FORMAT = "[%(asctime)s][rank %(rank)s][%(levelname)s] %(message)s"


def rank_zero_warn(logger: logging.Logger, message: str, *args: object) -> None:
    """Log a warning that every rank would give alike once, on rank 0 (the other ranks say nothing)."""
    from trainer.runtime import distributed

    if distributed.rank() == 0:
        logger.warning(message, *args, stacklevel=2)


def rank_zero_user_warning(logger: logging.Logger, python_warning: bool, message: str) -> None:
    """`rank_zero_warn`, or with ``python_warning`` a Python ``UserWarning`` on rank 0 instead: the
    mirror's Trainer gives Lightning's warnings as Lightning does, for programs that filter them and
    tests that catch them."""
    from trainer.runtime import distributed

    if distributed.rank() != 0:
        return
    if python_warning:
        warnings.warn(message, UserWarning, stacklevel=3)
    else:
        logger.warning(message, stacklevel=2)


class _RankFilter(logging.Filter):
    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


class RedactFilter(logging.Filter):
    """Secrets out of a record's message (the rules of `redact_secrets`), on a handler."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "_redacted", False):  # (cleaned by another handler's filter already)
            return True
        message = record.getMessage()
        clean = redact_secrets(message)
        if clean != message:
            record.msg, record.args = clean, ()
        record._redacted = True
        return True


def _add_redaction(handler: logging.Handler) -> None:
    if not any(isinstance(f, RedactFilter) for f in handler.filters):
        handler.addFilter(RedactFilter())


def configure_rank_logging(rank: int, own_handler: bool) -> None:
    """Set the ``trainer`` logger's level by rank and tag records with the rank.

    ``own_handler``: add a stderr handler (workers we spawned or torchrun ranks without Hydra's
    logging); in the Hydra process, Hydra's handlers (console + ``<run_dir>/train.log``) are kept.
    """
    logger = logging.getLogger("trainer")
    logger.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    for handler in list(logger.handlers):
        if getattr(handler, "_trainer_rank_handler", False):
            logger.removeHandler(handler)
            handler.close()
    if own_handler:
        handler = logging.StreamHandler(sys.stderr)
        handler.addFilter(_RankFilter(rank))  # on the handler: it sees records of child loggers too
        handler.setFormatter(logging.Formatter(_FORMAT))
        handler._trainer_rank_handler = True  # type: ignore[attr-defined]
        _add_redaction(handler)
        logger.addHandler(handler)
        logger.propagate = False
    else:
        logger.propagate = True
        for handler in logging.getLogger().handlers:  # Hydra's console and train.log
            _add_redaction(handler)


def log_to_file(path: str) -> None:
    """Also write the ``trainer`` logger's records to ``path`` (rank 0 of a run whose process did
    not run Hydra, so that ``<run_dir>/train.log`` holds the training log either way)."""
    logger = logging.getLogger("trainer")
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    handler.addFilter(_RankFilter(0))
    handler.setFormatter(logging.Formatter(_FORMAT))
    handler._trainer_rank_handler = True  # type: ignore[attr-defined]
    _add_redaction(handler)
    logger.addHandler(handler)
