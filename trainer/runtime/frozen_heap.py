"""The objects that exist when training starts, kept out of Python's garbage collector's scans.

A run imports torch and builds its model, data and optimizer before the first step: a few hundred
thousand Python objects that live as long as the run does. Python's cyclic garbage collector
rescans all of them at each of its full (oldest-generation) collections, several times in a run
of a few thousand steps, and each scan costs tens of milliseconds: time a hand-written loop pays
too, and that a trainer need not. ``gc.freeze()`` moves every object that exists at that moment to
a permanent generation the collector does not scan; the objects the steps create are collected as
before, and reference counting frees everything as before. When training ends, ``gc.unfreeze()``
gives the collector back the frozen objects, so a cycle among them that became garbage during
training is still collected (later than it would have been: the one cost).

Left alone when the program turned the collector off or froze objects itself.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Within the block, the objects that existed at its start are not scanned by the collector."""
    if not gc.isenabled() or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
