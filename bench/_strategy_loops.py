"""The hand-written torch loops of bench/strategy_baselines.py: each strategy written with torch's own
primitives as its documentation shows them, on ``world`` CPU ranks (gloo) under ``mp.spawn``.

- ``ddp``: ``DistributedDataParallel``, ``DistributedSampler``, two micro-batches per step, the first
  under ``no_sync()``;
- ``zero1``: the same with ``ZeroRedundancyOptimizer`` around AdamW;
- ``fsdp_full`` / ``fsdp_grad_op``: FSDP2 ``fully_shard`` on each block and the root,
  ``reshard_after_forward`` True / False, ``set_requires_gradient_sync(False)`` on the first micro-batch;
- ``pipeline_gpipe`` / ``pipeline_1f1b`` / ``pipeline_interleaved``: ``torch.distributed.pipelining``'s
  ``PipelineStage`` and ``ScheduleGPipe`` / ``Schedule1F1B`` / ``ScheduleInterleaved1F1B`` (2 stages per
  rank), the global batch cut into the same micro-batches as the trainer's;
- ``tp``: ``parallelize_module`` with ``ColwiseParallel`` on each block's ``up``, ``RowwiseParallel``
  on its ``down``; every rank reads the same global batch.

Each prints ``step N loss L`` every ``LOG_EVERY`` steps and at the last, as the trainer logs it.
"""

from __future__ import annotations

import contextlib
import os
import socket

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from _strategy_model import ACCUMULATE, GLOBAL_BATCH, LOG_EVERY, MICROBATCHES, adamw, blocks, dataset, loss_fn

DATA_PARALLEL = ("ddp", "zero1", "fsdp_full", "fsdp_grad_op")
PIPELINE = ("pipeline_gpipe", "pipeline_1f1b", "pipeline_interleaved")
STRATEGIES = DATA_PARALLEL + PIPELINE + ("tp",)


def _batches(loader: DataLoader, sampler):
    """The loader's batches epoch after epoch (the sampler told each new epoch)."""
    epoch = 0
    while True:
        if sampler is not None:
            sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def _report(step: int, steps: int, loss: torch.Tensor, rank: int, group_average: bool) -> None:
    if step % LOG_EVERY and step != steps:
        return
    value = loss.detach().clone()
    if group_average:
        dist.all_reduce(value)
        value /= dist.get_world_size()
    if rank == 0:
        print(f"step {step} loss {value.item():.4f}", flush=True)


def data_parallel(strategy: str, rank: int, world: int, steps: int, width: int, depth: int) -> None:
    model: nn.Module = nn.Sequential(*blocks(width, depth))
    data = dataset(width, steps * ACCUMULATE)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=GLOBAL_BATCH // (world * ACCUMULATE), sampler=sampler, drop_last=True)
    if strategy.startswith("fsdp"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        reshard = strategy == "fsdp_full"
        for block in model:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        optimizer = adamw(model.parameters())

        def sync_scope(last: bool):
            model.set_requires_gradient_sync(last)
            return contextlib.nullcontext()
    else:
        from torch.nn.parallel import DistributedDataParallel

        model = DistributedDataParallel(model)
        if strategy == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            from _strategy_model import LR

            optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=LR)
        else:
            optimizer = adamw(model.parameters())

        def sync_scope(last: bool):
            return contextlib.nullcontext() if last else model.no_sync()
    batches = _batches(loader, sampler)
    for step in range(1, steps + 1):
        total = torch.zeros(())
        for micro in range(ACCUMULATE):
            inputs, targets = next(batches)
            with sync_scope(micro == ACCUMULATE - 1):
                loss = loss_fn(model(inputs), targets) / ACCUMULATE
                loss.backward()
            total += loss.detach()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _report(step, steps, total, rank, group_average=True)


def pipeline(strategy: str, rank: int, world: int, steps: int, width: int, depth: int) -> None:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    layers = list(blocks(width, depth))
    virtual = 2 if strategy == "pipeline_interleaved" else 1
    stages_total = world * virtual
    if depth % stages_total:
        raise ValueError(f"{depth} blocks do not cut into {stages_total} equal stages")
    per = depth // stages_total
    own = [rank + k * world for k in range(virtual)]  # rank r runs stages r, r + world, ...
    stages = [PipelineStage(nn.Sequential(*layers[i * per:(i + 1) * per]), i, stages_total, torch.device("cpu"))
              for i in own]
    del layers
    if virtual > 1:
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    else:
        kind = ScheduleGPipe if strategy == "pipeline_gpipe" else Schedule1F1B
        schedule = kind(stages[0], n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    optimizer = adamw([p for stage in stages for p in stage.submod.parameters()])
    first, last = 0 in own, stages_total - 1 in own
    generator = torch.Generator().manual_seed(0)  # every rank draws the same order: the same batches
    loader = DataLoader(dataset(width, steps), batch_size=GLOBAL_BATCH, shuffle=True, generator=generator, drop_last=True)
    batches = _batches(loader, None)
    for step in range(1, steps + 1):
        inputs, targets = next(batches)
        losses: list[torch.Tensor] = []
        args = (inputs,) if first else ()
        schedule.step(*args, target=targets if last else None, losses=losses if last else None)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss = torch.stack(losses).mean() if last else torch.zeros(())
        if step % LOG_EVERY == 0 or step == steps:  # the last stage's loss, sent to rank 0's report
            dist.broadcast(loss, src=world - 1)
            _report(step, steps, loss, rank, group_average=False)


def tensor_parallel(strategy: str, rank: int, world: int, steps: int, width: int, depth: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model = nn.Sequential(*blocks(width, depth))
    mesh = init_device_mesh("cpu", (world,))
    for block in model:
        parallelize_module(block, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    optimizer = adamw(model.parameters())
    generator = torch.Generator().manual_seed(0)  # every rank reads the same batches
    loader = DataLoader(dataset(width, steps), batch_size=GLOBAL_BATCH, shuffle=True, generator=generator, drop_last=True)
    batches = _batches(loader, None)
    for step in range(1, steps + 1):
        inputs, targets = next(batches)
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        _report(step, steps, loss, rank, group_average=False)


def _worker(rank: int, strategy: str, world: int, steps: int, width: int, depth: int, port: int) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))  # as torchrun and the trainer do
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    run = pipeline if strategy in PIPELINE else tensor_parallel if strategy == "tp" else data_parallel
    run(strategy, rank, world, steps, width, depth)
    dist.barrier()
    dist.destroy_process_group()


def run_hand_written(strategy: str, world: int, steps: int, width: int, depth: int) -> None:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(strategy, world, steps, width, depth, port), nprocs=world)
