"""Lightning's ``seed_everything(seed=None, workers=False, verbose=True)``: seeds Python's ``random``,
NumPy and torch, and returns the seed."""

from __future__ import annotations

import logging
import os

from trainer.runtime.rank_logging import rank_zero_warn
from trainer.runtime.seeding import seed_everything as _seed_everything

log = logging.getLogger(__name__)

_MAX_SEED = 2**32 - 1


def seed_everything(seed: int | None = None, workers: bool = False, verbose: bool = True) -> int:
    """Seed every generator with ``seed`` (None: ``PL_GLOBAL_SEED`` from the environment, else 0,
    with a warning, as Lightning). ``workers`` is accepted either way: this trainer always seeds its
    data-loader workers (from the Trainer's seed, the epoch and the rank)."""
    if seed is None:
        from_environment = os.environ.get("PL_GLOBAL_SEED")
        if from_environment is None:
            seed = 0
            rank_zero_warn(log, "seed_everything(): no seed given, seed set to 0")
        else:
            seed = int(from_environment)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_SEED:
        raise ValueError(f"seed_everything({seed!r}): the seed must be an integer in [0, {_MAX_SEED}]")
    if verbose:
        log.info("Seed set to %d", seed)
    os.environ["PL_GLOBAL_SEED"] = str(seed)
    _seed_everything(seed)
    return seed
