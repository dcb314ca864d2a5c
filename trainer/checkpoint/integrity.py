"""Which files a committed checkpoint holds, and how big each one was when it was written.

The commit marker (``COMMITTED``) records ``files``: ``{relative path: size in bytes}`` for every
file of the checkpoint. No file is read back to get them: each rank takes the size of the small
files it has just written (its ``rng/rank-NNNNN.pt``; rank 0 also ``trainer_state.json`` and
``extras.pt``) and sends it in the gather that already tells rank 0 every rank's files are written;
the ``torch.distributed.checkpoint`` data files' sizes come from the metadata that DCP's save
gathers to its coordinator anyway (each item's offset + length), and rank 0 takes the size of the
files it wrote itself (``.metadata``, ``model_optim.pt``). No checksum: one would need the bytes
again (a second pass over every shard) and a size already catches the usual damage, a truncated
copy or upload.

Before a checkpoint is loaded every recorded file is checked (a ``stat`` per file): a missing one
or one whose size differs is named in a `CheckpointError`. A checkpoint committed before
sizes were recorded (no ``files`` in its marker) is loaded unchecked, as before, with one info line.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from trainer.checkpoint import layout

log = logging.getLogger(__name__)

FILES = "files"
DCP_FOLDER = "model_optim"


def sizes(root: str, relative_paths: list[str]) -> dict[str, int]:
    """``{relative path: size}`` of files this process has just written under ``root``."""
    return {rel: os.path.getsize(os.path.join(root, rel)) for rel in relative_paths}


def written_sizes(staging: str, full: bool, result: Any) -> dict[str, int]:
    """Rank 0, once the model / optimizer state is written: the sizes of its files. ``result`` is
    what DCP's (async) save returned for a sharded checkpoint (its global metadata)."""
    if full:
        return sizes(staging, ["model_optim.pt"])
    found: dict[str, int] = {}
    for info in (getattr(result, "storage_data", None) or {}).values():
        rel = f"{DCP_FOLDER}/{info.relative_path}"
        found[rel] = max(found.get(rel, 0), info.offset + info.length)
    if not found:  # a DCP without storage metadata: record nothing rather than a wrong size
        return {}
    found.update(sizes(staging, [f"{DCP_FOLDER}/.metadata"]))
    return found


def problem(path: str, marker: dict[str, Any] | None = None) -> str | None:
    """Why the committed checkpoint at ``path`` is damaged (naming the file), or None if every file
    its marker recorded is there with its recorded size (or the marker recorded none)."""
    marker = layout.read_marker(path) if marker is None else marker
    recorded = marker.get(FILES)
    if recorded is None:
        return None
    for rel, size in sorted(recorded.items()):
        file = os.path.join(path, rel)
        if not os.path.isfile(file):
            return f"{file} is missing (the commit recorded {size} bytes)"
        actual = os.path.getsize(file)
        if actual != size:
            return (f"{file} has {actual} bytes, the commit recorded {size}: the file is truncated or was "
                    "replaced after the save")
    return None


def verify(path: str, marker: dict[str, Any] | None = None) -> None:
    """Raise a `CheckpointError` naming the damaged file of the checkpoint at ``path``."""
    from trainer.checkpoint.loading import CheckpointError

    marker = layout.read_marker(path) if marker is None else marker
    if FILES not in marker:
        log.info("%s was saved before file sizes were recorded: its files are not checked before loading", path)
        return
    found = problem(path, marker)
    if found:
        raise CheckpointError(f"checkpoint {path} is damaged: {found}")


def resolve(resume: str, root: str) -> str | None:
    """``layout.resolve`` that never returns a damaged checkpoint. ``auto`` skips damaged ones (a
    warning names the file) for the newest intact one; if every checkpoint is damaged, or an explicit
    ``trainer.resume`` names a damaged one, raises a `CheckpointError`."""
    from trainer.checkpoint.loading import CheckpointError

    path = layout.resolve(resume, root)
    if path is None:
        return None
    if resume != "auto":
        verify(path)
        return path
    # ``latest`` first (it may name another than the highest step), then the others, newest first.
    candidates = [path] + [p for p in reversed(layout.committed_checkpoints(root)) if p != path]
    damaged = []
    for candidate in candidates:
        found = problem(candidate)
        if found is None:
            if damaged:
                log.warning("trainer.resume=auto: resuming from %s, the newest intact checkpoint", candidate)
            return candidate
        damaged.append(found)
        log.warning("trainer.resume=auto: skipping damaged checkpoint %s: %s", candidate, found)
    raise CheckpointError(f"trainer.resume=auto: no intact checkpoint in {root}; " + "; ".join(damaged))
