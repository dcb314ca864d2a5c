"""strategy=pipeline's step: each of the loop's micro-batches run through the schedule (padded to
fixed shapes, split into the schedule's microbatches), the loss of the last stage scaled so that the
gradients are those of the global-batch mean (or its token sum), the microbatches' records (loss,
metrics, token counts) and the metric names every stage reduces, the forward-only evaluation, and the
gradient norm and clipping over the stages. A base class of
`PipelineStrategy`; the stages and the schedule it runs are built
by ``pipeline_build.py``."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from trainer.optim.grad_clipping import clip_grad_values
from trainer.runtime import distributed
from trainer.runtime.metric_sums import WeightedSums, split_step_output
from trainer.strategies.pipeline_batches import batch_len, pad_batch, slice_batch
from trainer.strategies.pipeline_gradients import average_over_replicas, pipeline_grad_norm, scale_gradients
from trainer.strategies.pipeline_tp import loss_parallel_context, plain


class PipelineScheduleStep:
    """The step half of `PipelineStrategy`: it reads the strategy's
    degrees and ranks (set by ``setup_environment``) and the stages, schedule and module that
    ``pipeline_build.build_stages`` set."""

    @property
    def _stage_ranks(self) -> int:
        """The ranks that hold one stage: its replicas x its tensor-parallel ranks."""
        return self._data_parallel_size * self.tp

    @property
    def _reports(self) -> bool:
        """Whether this rank's loss and metrics count: the tensor-parallel ranks of the last stage
        compute the same values, and the first of them reports them (the others add zeros)."""
        return self.tp_rank == 0

    def _loss_fn(self, output: Any, index: torch.Tensor) -> torch.Tensor:
        """Called by the schedule on the last stage per microbatch; ``index`` = the sample positions."""
        # The microbatch's sample positions, read from the chunk's place in ``target`` (a view of
        # the arange ``_run`` passes): ``int(index[0])`` would be a host read per microbatch.
        start = index.storage_offset()
        stop = start + index.numel()
        real = max(0, min(stop, self._real) - start)
        if 0 < real < stop - start:  # padding inside the microbatch: the loss is the real samples' mean
            output, stop = slice_batch(output, 0, real), start + real
        loss, metrics = split_step_output(self._module.pipeline_loss(output, slice_batch(self._batch, start, stop)),
                                          "pipeline_loss")
        tokens = metrics.pop("num_tokens", None)  # a count (tokens/s, token normalisation), not a metric
        if tokens is not None:  # a Python count stays one (no copy to the device per microbatch)
            tokens = tokens * (real > 0) if isinstance(tokens, torch.Tensor) else (tokens if real > 0 else 0)
        # Keyed by microbatch: the schedule's first run after a (re)start also calls the loss
        # function once while it infers shapes; the microbatch's real call comes later and wins.
        self._records[start] = (real, {"loss": plain(loss), **{k: plain(v) for k, v in metrics.items()}}, plain(tokens))
        if self._scale is None:  # evaluation
            return loss
        if self._by_tokens:  # the token sum; the loop divides the gradients by the global token count
            if tokens is None:
                raise ValueError("trainer.loss_normalization=tokens needs pipeline_loss to return 'num_tokens' "
                                 "(the micro-batch's token count) next to 'loss'")
            # In fp64, never the loss dtype: bf16 cannot hold token counts above 256 exactly.
            return self._scale_loss(loss.to(torch.float64) * (tokens.to(torch.float64) if isinstance(tokens, torch.Tensor)
                                                              else float(tokens)))
        return self._scale_loss(loss * (real * self._scale))

    def _run(self, batch: Any, real: int, scale: float | None, autocast: Any) -> list:
        # The stages exchange fixed-shape buffers: every batch is padded to data.batch_size samples.
        size = max(self._batch_size, math.ceil(batch_len(batch) / self.microbatches) * self.microbatches)
        batch = pad_batch(batch, size)
        self._batch, self._real, self._scale, self._records = batch, real, scale, {}
        target = torch.arange(size)
        inputs = (self._module.pipeline_input(batch),) if self.is_first else ()
        with autocast, loss_parallel_context(self.tp > 1 and self.loss_parallel):
            if scale is None:
                self.schedule.eval(*inputs, target=target if self.is_last else None)
            else:
                self.schedule.step(*inputs, target=target if self.is_last else None, return_outputs=False)
        records, self._batch = [self._records[k] for k in sorted(self._records)], None
        return records

    def run_step(self, batch: Any, num_real: int, scale: float, sync: bool, sums: WeightedSums | None,
                 precision: Any, by_tokens: bool = False) -> tuple[Any, list[torch.Tensor]]:
        """Forward and backward of one of the loop's micro-batches through the pipeline. ``scale``:
        the loop's factor per real sample (data-parallel size / global count); ``sync``: the last micro-batch
        of the step (gradients are then averaged over the data-parallel group); ``by_tokens``:
        backward each microbatch's token sum (trainer.loss_normalization=tokens).

        Returns (this rank's token count: None if ``pipeline_loss`` reports none, a Python number
        while it returns Python ints, else a device tensor; 0 on the stages without the loss), and
        the microbatches' losses (detached; none on the stages without the loss). No host sync."""
        self._scale_loss, self._by_tokens = precision.scale_loss, by_tokens
        tokens: Any = 0
        losses = []
        saw_tokens = False
        for weight, values, count in self._run(batch, num_real, scale, precision.autocast(self.device)):
            losses.append(values["loss"].detach())
            if count is not None:
                saw_tokens = True
                if self._reports:  # the loop sums the counts over the world: once per replica
                    tokens = tokens + count
            if sums is not None and self._reports:
                sums.add(values, count if by_tokens else weight)
        if self._counts_tokens is None:  # agreed once: only the last stage sees pipeline_loss's output
            self._counts_tokens = any(distributed.all_gather_object(saw_tokens))
        if sync and self._data_parallel_size > 1 and not self.shards_stages:  # (FSDP reduces in the schedule)
            average_over_replicas(self.stage_parameters, self.dp_group, self._data_parallel_size)
        return (tokens if self._counts_tokens else None), losses

    def complete_metrics(self, sums: WeightedSums) -> None:
        """Stages without the loss add zero-weight zeros under the last stage's metric names, so
        every rank reduces the same keys (the names are agreed once)."""
        if self._metric_names is None:
            self._metric_names = sorted(set().union(*distributed.all_gather_object(sorted(sums.sums))))
        for name in self._metric_names:
            if name not in sums.sums:
                sums.sums[name] = torch.zeros((), dtype=torch.float64, device=self.device)

    def evaluate(self, batch: Any, precision: Any, num_real: int | None = None) -> list:
        """Forward-only pipeline over a validation batch: ``[(weight, metrics)]`` on the last stage.
        ``num_real``: samples that count (0 for the padding batches of lockstep validation)."""
        real = batch_len(batch) if num_real is None else num_real
        records = self._run(batch, real, None, precision.autocast(self.device))
        return [(weight, values) for weight, values, _ in records] if self._reports else []

    def after_evaluation(self, wrapped: nn.Module) -> None:
        from torch.distributed.fsdp import FSDPModule

        for stage in self.stage_modules:  # free what the evaluation forwards left gathered
            if isinstance(stage, FSDPModule):
                stage.reshard()

    def grad_norm(self, module: nn.Module) -> torch.Tensor:
        """The 2-norm over every stage's gradients (each element counted once over the world)."""
        return pipeline_grad_norm(self.stage_parameters, self._stage_ranks, self.device)

    def clip_grad_value(self, module: nn.Module, value: float) -> None:
        clip_grad_values(self.stage_parameters, value)  # this rank's stages

    def clip_grad_norm(self, module: nn.Module, max_norm: float) -> torch.Tensor:
        total = self.grad_norm(module)
        scale_gradients(self.stage_parameters, total, max_norm)
        return total
