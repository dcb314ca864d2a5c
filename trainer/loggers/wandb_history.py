"""What a W&B run already holds on this machine: the history steps in its ``.wandb`` files.

Each start of a W&B run (one per attempt of a job: a resumed job continues the same run id) writes
``<dir>/wandb/[offline-]run-<time>-<id>/run-<id>.wandb``; ``wandb sync`` uploads the files of one
run in the order they were started. A file is LevelDB's log format behind a 7-byte header (``:W&B``,
a magic number, a version): 32 KiB blocks of chunks, each with a 7-byte header (checksum, length,
type: 1 full, 2 first, 3 middle, 4 last), each record a ``Record`` protobuf of wandb's. W&B writes
it through a buffer: a process killed with ``kill -9`` leaves a prefix of its records, and the last
chunk may be cut short (read up to it).
"""

from __future__ import annotations

import glob
import os
import struct
from typing import Iterator

BLOCK = 32768
HEADER = 7


def run_files(wandb_root: str, run_id: str, exclude_dir: str | None = None) -> list[str]:
    """The ``.wandb`` files of run ``run_id`` under ``wandb_root`` (``<run_dir>/wandb``), oldest
    first, without the one in ``exclude_dir`` (the run being written now)."""
    # (a run started twice in one second gets a "-<n>" after the id)
    pattern = os.path.join(glob.escape(wandb_root), f"*run-*-{glob.escape(run_id)}*", f"run-{glob.escape(run_id)}.wandb")
    skip = os.path.abspath(exclude_dir) if exclude_dir else None
    files = [path for path in glob.glob(pattern) if os.path.abspath(os.path.dirname(path)) != skip]
    return sorted(files, key=lambda path: os.path.basename(os.path.dirname(path)).split("run-", 1)[-1])


def history_steps(path: str) -> list[int]:
    """The ``_step`` of every history row in the ``.wandb`` file ``path``, in the order written."""
    from wandb.proto.wandb_internal_pb2 import Record

    steps = []
    for payload in _records(path):
        record = Record()
        try:
            record.ParseFromString(payload)
        except Exception:  # a damaged record: what follows cannot be trusted either
            break
        if record.WhichOneof("record_type") == "history":
            steps.append(record.history.step.num)
    return steps


def last_step_held(wandb_root: str, run_id: str, exclude_dir: str | None = None) -> int:
    """The highest history step any earlier file of run ``run_id`` holds (0: none)."""
    return max((step for path in run_files(wandb_root, run_id, exclude_dir) for step in history_steps(path)), default=0)


def _records(path: str) -> Iterator[bytes]:
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b":W&B":
        return
    position, pending = HEADER, b""
    while position + HEADER <= len(data):
        left_in_block = BLOCK - position % BLOCK
        if left_in_block < HEADER:  # a block's tail too short for a chunk header is padding
            position += left_in_block
            continue
        _checksum, length, kind = struct.unpack("<IHB", data[position:position + HEADER])
        if (kind == 0 and length == 0) or position + HEADER + length > len(data):
            return  # zero padding, or a chunk cut short by a kill
        pending += data[position + HEADER:position + HEADER + length]
        position += HEADER + length
        if kind in (1, 4):
            yield pending
            pending = b""
        elif kind == 2:
            pending = data[position - length:position]
