"""Seeding: seeds derived from several parts, seeding every generator, and running a block under
a seed without disturbing the rank's own random streams."""

from __future__ import annotations

import contextlib
import hashlib
import random
from typing import Iterator

import torch


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from several parts, stable across processes and Python versions
    (``hash()`` is salted per process, so it cannot be used here)."""
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy (if installed) and torch (CPU and CUDA)."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % (1 << 32))
    except ImportError:  # NumPy is optional
        pass


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run a block with Python's ``random``, NumPy and torch (CPU, and CUDA once initialised)
    seeded with ``seed``, then put back the generators' states as they were: the same numbers on
    every rank inside, the rank's own streams untouched outside."""
    try:
        import numpy as np
    except ImportError:  # NumPy is optional
        np = None
    python_state, torch_state = random.getstate(), torch.get_rng_state()
    numpy_state = np.random.get_state() if np is not None else None
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    random.seed(seed)
    if np is not None:
        np.random.seed(seed % (1 << 32))
    torch.default_generator.manual_seed(seed)  # not torch.manual_seed: it would queue a CUDA seed for later
    if cuda_states is not None:
        torch.cuda.manual_seed_all(seed)
    try:
        yield
    finally:
        random.setstate(python_state)
        if np is not None:
            np.random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)


def _seed_dataloader_worker(worker_id: int) -> None:
    # torch already gives each worker initial_seed = loader base seed + worker_id, and the loader's
    # generator is seeded from (seed, epoch, rank); extend that seed to random and NumPy.
    seed_everything(torch.initial_seed() % (1 << 63))
