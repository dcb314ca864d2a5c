"""The training step's micro-batch loop where the strategy owns the step (pipeline parallel).

The training step (trainer/loop/train_step.py) calls it in place of the module's ``training_step`` loop;
the loop hands each of the step's micro-batches to the pipeline schedule (``OwnedStep.run_step``),
which splits it into the schedule's microbatches. The rest of the step (gradient normalisation,
unscaling, the optimizer step, the metrics) is the generic one.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterator

import torch

from trainer.loop.optimizer_step import EpochSkipped, train_batch_start
from trainer.observe.throughput import FlopSum

if TYPE_CHECKING:
    from trainer.runtime.metric_sums import WeightedSums
    from trainer.loop.step_accounting import TokenCount
    from trainer.strategies.pipeline import PipelineStrategy
    from trainer.loop.train_step import TrainStep


def pipeline_micro_batches(strategy: PipelineStrategy, step: TrainStep, plan: Any, batches: Iterator[Any],
                           sums: WeightedSums | None, local_tokens: TokenCount | None) -> None:
    """Run ``plan``'s micro-batches through the pipeline; adds the metrics to ``sums`` (logging steps),
    the tokens to ``local_tokens`` (tokens normalisation) and the losses to the non-finite loss watch."""
    run = step.run
    last = len(plan.micro_batches) - 1
    for index, micro_batch in enumerate(plan.micro_batches):
        batch = step.next_batch(batches)
        # FLOPs counted once, on the first logging step after the first step (which also infers
        # the stages' shapes); the stages differ, so the job's count is the sum over ranks (a
        # collective and a host read: on a logging step only).
        counting = run.throughput.flops_per_step is None and index == 0 and step.strategy_steps >= 1 and sums is not None
        counter = FlopSum() if counting else contextlib.nullcontext()
        try:
            train_batch_start(run, batch, run.batch_idx)  # (raises EpochSkipped on the module's -1)
        except EpochSkipped:
            if index == 0:  # nothing of the step has run: skipped as anywhere else
                raise
            raise ValueError(f"{type(run.module).__name__}.on_train_batch_start returned -1 at micro-batch {index} of "
                             "a step under strategy=pipeline, whose schedule already runs the step's earlier "
                             "micro-batches: return -1 on a step's first micro-batch (batch_idx % "
                             "accumulate_grad_batches == 0), or use trainer.should_stop = True") from None
        with run.breakdown.phase("forward"), counter:
            tokens, losses = strategy.run_step(batch, micro_batch.num_real, step.normalization.sample_factor(plan.global_count),
                                               index == last, sums, run.precision, local_tokens is not None)
        if counting:
            flops = torch.tensor(float(counter.get_total_flops()), dtype=torch.float64, device=run.device)
            run.throughput.set_flops_per_step(float(strategy.all_reduce_sum(flops)) * len(plan.micro_batches))
        if tokens is not None:  # (the same on every rank: the strategy agrees on it)
            step.note_tokens(tokens)
            if local_tokens is not None:
                local_tokens.add(tokens)
        if run.nonfinite is not None:
            for loss in losses:
                run.nonfinite.observe(loss)
        run.hooks.call("on_train_batch_end", None, batch, run.batch_idx)  # the strategy ran the steps
        run.micro_batch_done()
    if sums is not None:
        strategy.complete_metrics(sums)
    step.strategy_steps += 1
