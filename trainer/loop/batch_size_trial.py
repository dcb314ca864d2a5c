"""One trial of the batch-size finder: real training steps (forward, backward, optimizer step) at a
candidate micro-batch, their peak memory measured (trainer/runtime/peak_memory.py), and the run put back as it was.

What a trial puts back (``TrainingSnapshot``): parameters and buffers (each rank's local shard under
FSDP), the optimizer's state and hyperparameters, and (the caller's ``seeded`` block) every random
generator. The data position is untouched: a trial reads its samples straight from the dataset
(``dataset[i]`` for ``i`` = 0, 1, ..., cycling), never through the run's loader or plan. Learning-rate
schedulers are not stepped, no callback or module hook runs (the trials come before ``on_fit_start``),
and ``self.log`` values are dropped.
Not put back: Python state the module's ``training_step`` keeps itself.
"""

from __future__ import annotations

import copy
import gc
from typing import TYPE_CHECKING, Any

import torch

from trainer.runtime.metric_sums import split_step_output
from trainer.runtime.peak_memory import CudaPeak, TensorMemoryPeak
from trainer.runtime.tensors import local_tensor, move_to_device

if TYPE_CHECKING:
    from trainer.loop.rank_run import RankRun

# Two steps per trial: an optimizer creates its state lazily in its first step (after that step's
# backward), so only from the second step on do forward and backward run with it resident, as
# every later training step does (and as a resumed run's first step does).
TRIAL_STEPS = 2


def _optimizers(run: RankRun) -> list[torch.optim.Optimizer]:
    """The optimizers whose ``state`` holds the tensors (ZeRO-1: the local one over this rank's shard)."""
    return [run.strategy.stepping_optimizer(run.optimizer)]


def _resident(run: RankRun) -> list[torch.Tensor]:
    """Tensors alive before a trial that its memory includes: the model and the optimizer state."""
    tensors = [*run.module.parameters(), *run.module.buffers()]
    for optimizer in _optimizers(run):
        for state in optimizer.state.values():
            tensors += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return tensors


class TrainingSnapshot:
    """A copy (on the CPU) of what a trial step changes, put back in place by `restore`."""

    def __init__(self, run: RankRun):
        self.run = run
        self.training = run.module.training
        self.tensors = [(t, local_tensor(t).detach().to("cpu", copy=True))
                        for t in [*run.module.parameters(), *run.module.buffers()]]
        self.optimizers = []
        for optimizer in _optimizers(run):
            state = {p: {k: local_tensor(v).detach().to("cpu", copy=True) if isinstance(v, torch.Tensor) else copy.deepcopy(v)
                         for k, v in s.items()} for p, s in optimizer.state.items()}
            groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
            self.optimizers.append((optimizer, state, groups))

    @torch.no_grad()
    def restore(self) -> None:
        for tensor, saved in self.tensors:
            local_tensor(tensor).copy_(saved)
        for optimizer, state, groups in self.optimizers:
            for param in [p for p in optimizer.state if p not in state]:  # state the trial created
                del optimizer.state[param]
            for param, saved_state in state.items():
                live = optimizer.state[param]
                for key in [k for k in live if k not in saved_state]:
                    del live[key]
                for key, value in saved_state.items():
                    if isinstance(value, torch.Tensor) and isinstance(live.get(key), torch.Tensor):
                        local_tensor(live[key]).copy_(value)  # in place: the step updated it in place
                    else:
                        live[key] = copy.deepcopy(value)
            for group, saved_group in zip(optimizer.param_groups, groups):
                group.update(copy.deepcopy(saved_group))
        self.run.module.train(self.training)


def trial_batch(run: RankRun, size: int) -> Any:
    """``size`` samples of the training set (indices 0, 1, ... cycling), collated, on the device."""
    dataset = run.data.train_set()
    samples = [dataset[i % len(dataset)] for i in range(size)]
    batch = move_to_device(run.data.train_collate(samples), run.device)
    return run.precision.convert_input(batch)


def trial_step(run: RankRun, size: int) -> None:
    """One training step at micro-batch ``size``: ``training_step``, backward, optimizer step, zero_grad."""
    strategy, precision, logs = run.strategy, run.precision, run.module_logs
    run.module.train()
    with logs.stage("train"):
        logs.begin_step(False)  # self.log works as on a non-logging step; nothing is kept or reduced
        try:
            batch = trial_batch(run, size)
            with strategy.sync_context(run.wrapped, sync=True):
                with precision.autocast(run.device), logs.micro_batch(size):
                    output = run.wrapped(batch, 0)
                loss, _ = split_step_output(output, "training_step")
                if loss is None:  # (a skipped batch in training: the trial measures a backward)
                    raise ValueError(f"training_step returned no loss in the batch-size finder's trial step (batch_idx 0, "
                                     f"{size} samples), which measures the memory of a forward and backward: return a "
                                     "loss for it (a tensor or a dict with 'loss'), or set the batch size yourself")
                precision.scale_loss(loss).backward()
            del output, loss, batch
            strategy.optimizer_step(run.optimizer)
            run.optimizer.zero_grad(set_to_none=True)
        finally:
            logs.end_step(strategy)  # not a logging step: no reduction, no collective


def measure_trial(run: RankRun, size: int) -> tuple[float, bool]:
    """``(peak bytes, out of memory)`` of ``TRIAL_STEPS`` training steps at ``size``; the run's state put back after them.
    CUDA's out-of-memory error is caught (and the cache freed): it counts as over the limit."""
    snapshot = TrainingSnapshot(run)
    cuda = run.device.type == "cuda"
    meter: Any = CudaPeak(run.device) if cuda else TensorMemoryPeak(_resident(run))
    out_of_memory = False
    try:
        with meter:
            for _ in range(TRIAL_STEPS):
                trial_step(run, size)
    except torch.cuda.OutOfMemoryError:
        if not cuda:
            raise
        out_of_memory = True
    finally:
        run.optimizer.zero_grad(set_to_none=True)
        snapshot.restore()
        if cuda:
            gc.collect()
            torch.cuda.empty_cache()
    return float(meter.peak), out_of_memory
