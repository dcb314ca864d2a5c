"""Python logging that knows its rank: INFO on rank 0, WARNING elsewhere, every line tagged.

A warning that every rank would give alike (a config or wrapping warning) goes through
``rank_zero_warn``: logged once, by rank 0. One that only some ranks hit uses ``log.warning`` and
keeps its rank tag.
"""

from __future__ import annotations

import logging
import sys

_FORMAT = "[%(asctime)s][rank %(rank)s][%(levelname)s] %(message)s"


def rank_zero_warn(logger: logging.Logger, message: str, *args: object) -> None:
    """Log a warning that every rank would give alike once, on rank 0 (the other ranks say nothing)."""
    from trainer.runtime import distributed

    if distributed.rank() == 0:
        logger.warning(message, *args, stacklevel=2)


class _RankFilter(logging.Filter):
    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank = self.rank
        return True


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
        logger.addHandler(handler)
        logger.propagate = False
    else:
        logger.propagate = True


def log_to_file(path: str) -> None:
    """Also write the ``trainer`` logger's records to ``path`` (rank 0 of a run whose process did
    not run Hydra, so that ``<run_dir>/train.log`` holds the training log either way)."""
    logger = logging.getLogger("trainer")
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    handler.addFilter(_RankFilter(0))
    handler.setFormatter(logging.Formatter(_FORMAT))
    handler._trainer_rank_handler = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
