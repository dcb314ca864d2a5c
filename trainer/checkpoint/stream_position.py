"""The stream position in a checkpoint: one small file per rank, ``stream/rank-NNNNN.pt``.

invariant: every rank reads the same stream, so rank 0's position is loaded on every rank of any
world size. sharded: each rank loads the position of its data-parallel rank (the file records it:
under tensor parallelism several ranks read the same shards, and a run on another mesh numbers them
differently); another data-parallel world size is an error naming both.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from trainer.checkpoint.loading import load_file
from trainer.data.streaming.plan import is_stream
from trainer.runtime import distributed


def stream_state(plan: Any, epoch: int, epoch_step: int) -> dict[str, Any]:
    """This rank's stream position as ``{file name in the checkpoint: its content}`` (empty when
    ``plan`` is not a stream plan)."""
    if not is_stream(plan):
        return {}
    name = f"stream/rank-{distributed.rank():05d}.pt"
    return {name: {**plan.checkpoint_state(epoch, epoch_step), "data_rank": plan.rank}}


def save_stream_state(plan: Any, epoch: int, epoch_step: int, staging: str) -> list[str]:
    """Write this rank's stream position into the checkpoint being staged; the files written (none
    when ``plan`` is not a stream plan)."""
    parts = stream_state(plan, epoch, epoch_step)
    for name, state in parts.items():
        os.makedirs(os.path.join(staging, "stream"), exist_ok=True)
        torch.save(state, os.path.join(staging, name))
    return list(parts)


def _of_data_rank(path: str, data_rank: int) -> Any:
    """The saved position of a rank that read ``data_rank``'s shards (None: no such file)."""
    folder = os.path.join(path, "stream")
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        state = load_file(os.path.join(folder, name))
        if state.get("data_rank") == data_rank:
            return state
    return None


def restore_stream_state(plan: Any, path: str, epoch: int, epoch_step: int) -> None:
    """Put ``plan`` at the checkpoint's stream position (``epoch`` / ``epoch_step``: the progress the
    checkpoint restored)."""
    if not is_stream(plan):
        return

    def read(rank: int) -> Any:
        file = os.path.join(path, "stream", f"rank-{rank:05d}.pt")
        return load_file(file) if os.path.isfile(file) else None

    state = read(0)  # every rank's position in invariant mode; the checks' facts in both
    if state is None:
        if epoch_step == 0:
            return  # at an epoch boundary there is no position to restore
        raise ValueError(f"{path} has no stream position (stream/): it was not saved by a run on a streaming dataset")
    if state["mode"] != plan.mode:
        raise ValueError(f"{path} was saved with data.stream_mode={state['mode']}, this run uses "
                         f"data.stream_mode={plan.mode}: resume with data.stream_mode={state['mode']}")
    if plan.mode == "sharded" and state["world"] != plan.world:
        raise ValueError(f"{path} was saved by a data.stream_mode=sharded run on {state['world']} data-parallel ranks; "
                         f"this run has {plan.world}: sharded streams resume on the same world size only (each rank's "
                         f"shards depend on it); resume on {state['world']} ranks, or use data.stream_mode=invariant")
    if state["num_workers"] != plan.num_workers:
        raise ValueError(f"{path} was saved with data.num_workers={state['num_workers']}, this run has "
                         f"data.num_workers={plan.num_workers}: the stream's readers differ; resume with "
                         f"data.num_workers={state['num_workers']}")
    if plan.mode == "sharded":
        state = read(distributed.rank())
        if state is None or state.get("data_rank", plan.rank) != plan.rank:  # (older files: no data_rank)
            state = _of_data_rank(path, plan.rank)  # another mesh: this rank's number read other shards then
        # Every rank learns which ranks' positions are missing (one small all-reduce): all fail with the
        # same error instead of the others waiting for the failed rank until the collective timeout.
        _, missing = distributed.any_rank_and_values(state is None, int(state is None))
        if any(missing):
            ranks = [r for r, gone in enumerate(missing) if gone]
            raise ValueError(f"{path} has no stream position for rank(s) {ranks} (stream/rank-NNNNN.pt missing): "
                             "the checkpoint is incomplete; resume from another checkpoint")
    if (state["epoch"], state["epoch_step"]) != (epoch, epoch_step):
        raise ValueError(f"{path}: the stream position is for epoch {state['epoch']} step {state['epoch_step']}, the "
                         f"checkpoint's progress is epoch {epoch} step {epoch_step}")
    if epoch_step > 0:
        plan.resume = (epoch, epoch_step, state["loader"])
