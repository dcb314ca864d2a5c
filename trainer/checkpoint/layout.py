"""Where checkpoints live on disk and how one is committed atomically.

::

    <root>/
      latest                  -> text: "step-000000500" (moved last, with an atomic rename)
      step-000000500/
        COMMITTED             json: step, format, world size and device mesh, monitored metric (written last)
        trainer_state.json    progress (epoch, step, global_step, position in the epoch) and the config
        extras.pt             scheduler, loss scaler and callback states
        hparams.pt            the objects among the hyperparameters, pickled (read by load_from_checkpoint only)
        rng/rank-00000.pt     every generator of each rank
        model_optim/          sharded: torch.distributed.checkpoint files, one per rank
        model_optim.pt        full: one consolidated {"model", "optim"} file
      .staging-step-000000600/  a save in progress (or interrupted): never loaded, removed later

A save writes into the staging directory (every rank makes the folders it writes into, so no
barrier); each rank fsyncs the files it wrote (DCP fsyncs its own), and once every rank has said
so (the gather that carries the files' sizes, and DCP's own final gather) rank 0 commits in a
background thread (``commit``): it fsyncs its own unsynced files and the folders, writes
COMMITTED, renames the folder to its final name and finally replaces ``latest``; then deletes old
checkpoints (``apply_retention``). A crash at any point leaves the previous checkpoint complete
and ``latest`` pointing at it. Readers in the same process (``find_latest``,
``committed_checkpoints``) first wait for a commit in flight under their root, so what a save
returned from is what they see. Assumes a file system every rank sees (a shared one on several
nodes).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import re
import shutil
import threading
from typing import Any, Iterator

LATEST = "latest"
COMMITTED = "COMMITTED"
STAGING_PREFIX = ".staging-"
_NAME = re.compile(r"^step-(\d+)$")


def checkpoint_name(step: int) -> str:
    return f"step-{step:09d}"


def staging_path(root: str, step: int, again: int = 0) -> str:
    """The staging folder of a save of ``step``; ``again``: how many saves of the same step this run
    made before (an epoch-end save right after a periodic one), which may still be committing."""
    return os.path.join(root, STAGING_PREFIX + checkpoint_name(step) + (f".{again}" if again else ""))


# ----- commits in flight (rank 0's background thread) -------------------------------------------------------
_in_flight: dict[str, concurrent.futures.Future] = {}
_in_flight_lock = threading.Lock()
_committing = threading.local()


def register_commit(root: str, future: concurrent.futures.Future) -> None:
    """Readers of ``root`` in this process wait for ``future`` (a commit and its retention) first."""
    key = os.path.abspath(root)
    with _in_flight_lock:
        _in_flight[key] = future

    def forget(done: concurrent.futures.Future) -> None:
        with _in_flight_lock:
            if _in_flight.get(key) is done:
                del _in_flight[key]

    future.add_done_callback(forget)


def settle(root: str) -> None:
    """Wait for the commit in flight under ``root`` (if any); its error is the committer's to raise."""
    future = _in_flight.get(os.path.abspath(root))
    if future is not None and not getattr(_committing, "active", False):
        concurrent.futures.wait([future])


@contextlib.contextmanager
def committing() -> Iterator[None]:
    """Marks the committer thread, whose own reads (retention) must not wait for themselves."""
    _committing.active = True
    try:
        yield
    finally:
        _committing.active = False


def is_committed(path: str) -> bool:
    return os.path.isfile(os.path.join(path, COMMITTED))


def read_marker(path: str) -> dict[str, Any]:
    with open(os.path.join(path, COMMITTED), encoding="utf-8") as handle:
        return json.load(handle)


def fsync_files(root: str, relative_paths: list[str]) -> None:
    """Make files this process wrote under ``root`` durable (each rank its own: in parallel, and on
    the node whose page cache holds them, which a shared file system needs)."""
    for rel in relative_paths:
        with open(os.path.join(root, rel), "rb") as handle:
            os.fsync(handle.fileno())


def _fsync_folders(path: str) -> None:
    for folder, _, _ in os.walk(path):
        _fsync_dir(folder)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, text: str) -> None:
    """Replace ``path`` with ``text`` so that readers see the old or the new file, never a part."""
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    _fsync_dir(os.path.dirname(path) or ".")


def commit(root: str, staging: str, marker: dict[str, Any], unsynced: tuple[str, ...] = ()) -> str:
    """Make the staged checkpoint durable and visible; returns its final path. Rank 0 only, once
    every rank's files are written and fsynced but ``unsynced`` (relative paths rank 0 wrote
    without an fsync: ``model_optim.pt`` of the full format)."""
    fsync_files(staging, list(unsynced))
    _fsync_folders(staging)  # the folders' entries (files every rank created)
    write_atomic(os.path.join(staging, COMMITTED), json.dumps(marker))
    final = os.path.join(root, checkpoint_name(marker["step"]))
    if os.path.exists(final):  # the same step saved again (e.g. at the end after a periodic save)
        shutil.rmtree(final)
    os.rename(staging, final)
    _fsync_dir(root)
    write_atomic(os.path.join(root, LATEST), os.path.basename(final))
    return final


def committed_checkpoints(root: str) -> list[str]:
    """Complete checkpoints under ``root``, oldest step first."""
    settle(root)
    if not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        match = _NAME.match(name)
        if match and is_committed(os.path.join(root, name)):
            found.append((int(match.group(1)), os.path.join(root, name)))
    return [path for _, path in sorted(found)]


def find_latest(root: str) -> str | None:
    """The checkpoint ``latest`` names if it is complete, else the newest complete one, else None."""
    settle(root)
    pointer = os.path.join(root, LATEST)
    if os.path.isfile(pointer):
        with open(pointer, encoding="utf-8") as handle:
            candidate = os.path.join(root, handle.read().strip())
        if is_committed(candidate):
            return candidate
    found = committed_checkpoints(root)
    return found[-1] if found else None


def remove_stale_staging(root: str) -> None:
    """Delete staging directories that interrupted saves left behind."""
    if os.path.isdir(root):
        for name in os.listdir(root):
            if name.startswith(STAGING_PREFIX):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def apply_retention(root: str, keep_last: int | None, monitor: str | None, mode: str, keep_best: int) -> list[str]:
    """Delete committed checkpoints that are neither among the ``keep_last`` newest nor the
    ``keep_best`` best by ``monitor``; never the one ``latest`` names. Returns the deleted paths."""
    found = committed_checkpoints(root)
    if keep_last is None:
        return []
    keep = set(found[-keep_last:]) if keep_last > 0 else set()
    latest = find_latest(root)
    if latest:
        keep.add(latest)
    if monitor and keep_best > 0:
        scored = [(read_marker(p).get("metrics", {}).get(monitor), p) for p in found]
        scored = [(v, p) for v, p in scored if v is not None]
        scored.sort(key=lambda item: item[0], reverse=(mode == "max"))
        keep |= {p for _, p in scored[:keep_best]}
    deleted = [p for p in found if p not in keep]
    for path in deleted:
        shutil.rmtree(path, ignore_errors=True)
    return deleted


def resolve(resume: str, root: str) -> str | None:
    """The checkpoint directory ``trainer.resume`` names: "auto" = the latest complete one under
    ``root`` (None if there is none yet); a checkpoint directory; or a root holding checkpoints."""
    if resume == "auto":
        return find_latest(root)
    path = os.path.abspath(resume)
    if os.path.isfile(path):  # a checkpoint packed into one file (single_file.py)
        from trainer.checkpoint.single_file import is_packed, unpacked

        if not is_packed(path):
            raise FileNotFoundError(f"trainer.resume={resume!r} is a file this trainer did not write as a checkpoint; "
                                    "give a checkpoint file or directory, a directory of checkpoints, or auto")
        path = unpacked(path)
    if is_committed(path):
        return path
    if os.path.isdir(path):
        latest = find_latest(path)
        if latest:
            return latest
        raise FileNotFoundError(
            f"trainer.resume={resume!r}: no complete checkpoint there (a complete one has a {COMMITTED} file; "
            "a save that was interrupted has none and is never loaded)"
        )
    raise FileNotFoundError(f"trainer.resume={resume!r} does not exist; give a checkpoint directory, a directory of checkpoints, or auto")
