"""A save that could not be written (a full disk, most often): its staging folder is removed and
one line names the checkpoint, the cause and the space left there (torch.save's own writer reports
a full disk without an errno, so the space is always given)."""

from __future__ import annotations

import errno
import os
import shutil
import sys
from typing import Any

from trainer.runtime import distributed
from trainer.checkpoint import layout
from trainer.checkpoint.loading import CheckpointError


def is_disk_full(error: BaseException | None) -> bool:
    """Whether ``error`` or an error it wraps (its cause, its context, DCP's per-rank failures) is
    ENOSPC or EDQUOT (a full disk or an exceeded quota)."""
    seen: set[int] = set()
    pending = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        pending += [current.__cause__, current.__context__]
        if _is_dcp_failure(current):
            pending += [wrapped[0] for wrapped in current.failures.values()]
    return False


def _is_dcp_failure(error: BaseException) -> bool:
    # DCP is imported by the saves that use it, not here (it costs a second at every start): where it
    # was never imported, nothing raised its exception.
    api = sys.modules.get("torch.distributed.checkpoint.api")
    return api is not None and isinstance(error, api.CheckpointException)


def __getattr__(name: str) -> Any:
    # ``WRITE_ERRORS``: what a failed write raises: DCP's CheckpointException (every rank's failures,
    # raised on every rank) derives from BaseException. Built when an ``except`` clause reads it,
    # that is when a write failed, so that importing this module does not import DCP.
    if name == "WRITE_ERRORS":
        from torch.distributed.checkpoint.api import CheckpointException

        return (Exception, CheckpointException)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _size(size: int) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


def space_on(root: str) -> str:
    """How much space the file system of ``root`` has left, in words."""
    try:
        usage = shutil.disk_usage(root)
    except OSError:
        return f"free space on {root} unknown"
    return f"{_size(usage.free)} free of {_size(usage.total)} on {root}"


def failure(error: BaseException, rank: int) -> tuple[int, str, bool]:
    """What a rank tells the others of its failed write: (rank, the error in one line, disk full)."""
    if _is_dcp_failure(error) and error.failures:  # type: ignore[attr-defined]  # its text holds each rank's traceback
        rank = min(error.failures)
        error = error.failures[rank][0]
    return rank, " ".join(f"{type(error).__name__}: {error}".split()), is_disk_full(error)


def describe(staging: str, root: str, rank: int, cause: str, disk_full: bool) -> str:
    """The one line for a save of ``staging`` whose write failed on ``rank`` with ``cause``."""
    where = f"rank {rank}: " if rank else ""
    previous = layout.find_latest(root) if os.path.isdir(root) else None
    kept = f"`latest` is still {previous}" if previous else "no earlier checkpoint exists"
    space = space_on(root)
    if disk_full:
        return (f"checkpoint {staging} not saved: no space left on device ({space}; {where}{cause}); "
                f"{kept}; free space there or set checkpoint.dir elsewhere")
    return f"checkpoint {staging} not saved ({where}{cause}; {space}); {kept}"


def abandon(staging: str, root: str, rank: int, cause: str, disk_full: bool) -> CheckpointError:
    """Remove the staging folder of a failed save and return the error to raise (every rank raises
    it; rank 0 removes the folder)."""
    if distributed.rank() == 0:
        shutil.rmtree(staging, ignore_errors=True)
    return CheckpointError(describe(staging, root, rank, cause, disk_full))
