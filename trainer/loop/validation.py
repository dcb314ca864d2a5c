"""A validation pass over the whole validation set, on every rank, with exact means.

Each rank takes its share of the set (every sample exactly once, no padding duplicates); the
metric sums and weights are reduced in one all-reduce. Strategies whose forwards are collectives
(FSDP, pipeline x FSDP) run in lockstep: short ranks add zero-weight forwards. Under the pipeline
the strategy runs the forward (``evaluate``) and the last stage reports.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from trainer.api.hook_calls import call_step, require_dataloader_idx
from trainer.runtime.metric_sums import WeightedSums, format_metrics, split_step_output
from trainer.loop.grad_mode import evaluation_grad_mode
from trainer.loop.log_collector import merge_logged
from trainer.observe.progress import ProgressBar
from trainer.runtime.rank_logging import rank_zero_warn
from trainer.runtime.seeding import derive_seed
from trainer.loop.run_limits import disables, val_sample_limit
from trainer.loop.stream_limits import is_stream
from trainer.data.streaming.validation import val_length
from trainer.loop.eval_modes import EvalModes
from trainer.loop.eval_step_logs import EvalStepLogs
from trainer.loop.optimizer_step import transfer_batch

if TYPE_CHECKING:
    from trainer.loop.rank_run import RankRun

log = logging.getLogger(__name__)


def check_validation_setup(trainer: Any, module: Any, val_set: Any) -> None:
    """One warning (rank 0) for a validation setting that would do nothing: validation only shows
    how a run goes, so it may be skipped, but never silently."""
    every = trainer.val_every_n_steps
    monitor = trainer.checkpoint.monitor if trainer.checkpoint is not None else None
    if val_set is None and monitor and monitor.startswith("val/"):
        raise ValueError(f"checkpoint.monitor={monitor!r}, but {type(module).__name__} has no val_dataset() / "
                         "val_dataloader(), so it is never logged; return validation data or monitor a train/ metric")
    if val_set is None:
        if every:
            rank_zero_warn(log, "trainer.val_every_n_steps=%d, but %s has no val_dataset() / val_dataloader(): nothing "
                           "is validated; return validation data, or unset trainer.val_every_n_steps", every,
                           type(module).__name__)
        defaults = getattr(trainer, "lightning_defaults", ())  # (Lightning's Trainer sets them unasked)
        given = [f"trainer.{name}={getattr(trainer, name)}" for name in ("limit_val_batches", "check_val_every_n_epoch")
                 if getattr(trainer, name, None) is not None and name not in defaults]
        if given and not trainer.fast_dev_run:  # (fast_dev_run sets limit_val_batches itself)
            rank_zero_warn(log, "%s: %s has no val_dataset() / val_dataloader(), so nothing is validated",
                           ", ".join(given), type(module).__name__)


def run_validation(run: RankRun, sanity_batches: int | None = None) -> dict[str, float]:
    """Validate ``run``'s module at its current step; logs and returns the ``val/`` metrics.
    ``sanity_batches``: the sanity pass before training (``trainer/loop/sanity_check.py``): that many
    batches (-1: all), the hooks called as in any pass, nothing reduced or logged. The whole pass, its
    hooks included, runs under the evaluation grad mode (``inference_mode``), as Lightning's."""
    if sanity_batches is None and run.data_reload is not None and not disables(run.trainer.limit_val_batches):
        run.data_reload.before_validation(run)  # reload_dataloaders_every_n_epochs (a fit's pass)
    if run.val_set is None or disables(run.trainer.limit_val_batches):  # (limit_val_batches=0: no validation)
        return {}
    with run.stage("validate" if sanity_batches is None else "sanity_check"), evaluation_grad_mode(run):
        return _validation_pass(run, sanity_batches)


def _validation_pass(run: RankRun, sanity_batches: int | None) -> dict[str, float]:
    strategy, hooks, sanity = run.strategy, run.hooks, sanity_batches is not None
    parts = run.data.val_parts or [run.data]  # several loaders: one part each (dataloader_idx 0, 1, ...)
    # (a list of one loader is one loader, as Lightning: no dataloader_idx, no "/dataloader_idx_0")
    indices: list[int | None] = list(range(len(parts))) if len(parts) > 1 else [None]
    if len(parts) > 1 and strategy.owns_step:
        raise ValueError(f"{run.data.hooks.where['val']} gives {len(parts)} loaders: the pipeline strategy validates "
                         "one loader with its own loss; return one DataLoader")
    if len(parts) > 1:
        require_dataloader_idx(run.module, "validation_step", "val_dataloader", len(parts))
    sums = {idx: WeightedSums(run.device) for idx in indices}
    if run.trainer.stage == "fit" and not sanity:
        hooks.call_module("on_validation_model_zero_grad")  # (default: frees the gradients, as Lightning)
    shards = [_loader_shard(run, data, sanity_batches) for data in parts]  # (count, shard, limit) per loader
    run.count_val_batches([count for count, _, _ in shards])  # trainer.num_val_batches (a stream's: inf)
    modes = EvalModes(hooks, "validation")
    modes.enter()
    logs = run.module_logs
    # self.log in validation_step and in the validation epoch hooks: aggregated over this whole pass
    # (a sanity pass's values are dropped: the next pass begins the stage afresh).
    with logs.stage("validate"):
        hooks.call("on_validation_start")
        hooks.call("on_validation_epoch_start")
        for idx, shard, data in zip(indices, shards, parts):
            _loader_pass(run, data, idx, sanity, shard, sums[idx])
        if any(is_stream(shard) for _, shard, _ in shards):  # (a stream's count is known at its end)
            run.count_val_batches([shard.real if is_stream(shard) else count for count, shard, _ in shards])
        strategy.after_evaluation(run.wrapped)
        hooks.call("on_validation_epoch_end")  # what it logs belongs to this pass
        metrics: dict[str, float] = {}
        for idx in indices:  # (every rank reduces each loader's sums, its own possibly empty)
            suffix = "" if idx is None else f"/dataloader_idx_{idx}"
            reduced = sums[idx].reduce("val/", run.strategy, some_ranks_may_be_empty=True)
            metrics.update({name + suffix: value for name, value in reduced.items()})
        merge_logged(metrics, logs.epoch_metrics("validate", strategy), logs)
    if sanity:  # not logged: in callback_metrics for this pass's hooks only (the sanity check puts them back)
        run.last_metrics.update(metrics)
    elif metrics:
        run.log(metrics)
        log.info("validation at step %d  %s", run.step, format_metrics(metrics))
    if not sanity and run.lr_scheduling is not None:  # (a fit's)
        run.lr_scheduling.on_validation_end(metrics)  # ReduceLROnPlateau on val/ metrics
    hooks.call("on_validation_end", metrics)  # (Lightning's shape without the metrics works too)
    modes.exit()
    return metrics


def _loader_shard(run: RankRun, data: Any, sanity_batches: int | None) -> tuple[int | float, Any, int | None]:
    """(this rank's batches, its shard, the sample limit) of one validation loader (a stream's count: inf
    until it ends, as Lightning's)."""
    setting = run.trainer.limit_val_batches if sanity_batches is None else sanity_batches
    limit = val_sample_limit(setting, data.val_batch_size, run.data_parallel_size,
                             val_length(data.val_set, setting))  # the first samples
    shard = data.val_shard(run.epoch, run.data_rank, run.data_parallel_size, limit)  # the loader's batch_size, or data's
    return (math.inf if is_stream(shard) else len(shard)), shard, limit


def _loader_pass(run: RankRun, data: Any, dataloader_idx: int | None, sanity: bool,
                 planned: tuple[int | float, Any, int | None], sums: WeightedSums) -> None:
    """One validation loader's batches on this rank (``dataloader_idx`` None: the only loader, not passed
    to the steps and hooks, as Lightning); adds to ``sums``."""
    module, strategy, hooks = run.module, run.strategy, run.hooks
    extra = () if dataloader_idx is None else (dataloader_idx,)  # the steps' and batch hooks' last argument
    reduces_outputs = getattr(run.trainer, "reduces_eval_outputs", True)
    count, shards, limit = planned
    stream = is_stream(shards)  # read as the pass goes: its length is known at the end
    real = None if stream else count  # batches of this rank before the lockstep padding below
    if strategy.lockstep_forward:
        # Every rank runs as many forwards as the busiest one; the extra ones re-read the first
        # sample and count with weight 0, so the metrics stay exact means over the set.
        if stream:
            shards = shards.padded_to_the_busiest()
        else:
            shards = shards.padded(len(data.val_shard(run.epoch, 0, run.data_parallel_size, limit)))

        def forward(batch: Any, index: int) -> Any:
            return run.wrapped(batch, index, "validation_step", *extra)
    else:
        def forward(batch: Any, index: int) -> Any:
            return call_step(module, "validation_step", batch, index, *extra)
    if stream:
        batches = shards.weighted()
    else:
        weights = shards.sizes()  # (lazily: the shard builds each batch only when loaded)
        seed = derive_seed(run.trainer.seed, "val", run.epoch, run.data_rank, *extra)
        batches = ((weight, batch, index < real) for index, (weight, batch)
                   in enumerate(zip(weights, data.loader(data.val_set, shards, "val", seed))))

    def step(batch: Any, index: int) -> Any:
        with run.precision.autocast(run.device):
            return forward(batch, index)
    enabled = run.trainer.progress_bar if run.rank == 0 else False
    bar = ProgressBar(None if stream else len(shards), enabled, desc="validate", unit="batch", leave=False)
    busiest = None if stream else (len(shards) if strategy.lockstep_forward else
                                   len(data.val_shard(run.epoch, 0, run.data_parallel_size, limit)))
    step_logs = EvalStepLogs(run, "validate", busiest, not sanity, dataloader_idx)  # self.log(..., on_step=True)
    logs = run.module_logs
    logs.use_dataloader(dataloader_idx)  # self.log names get "/dataloader_idx_N" with several loaders
    with evaluation_grad_mode(run):
        for index, (weight, batch, is_real) in enumerate(batches):
            bar.update()
            batch = run.precision.convert_input(transfer_batch(run, batch, dataloader_idx=dataloader_idx or 0))
            if strategy.owns_step:  # pipeline: the last stage reports, the others add nothing
                for part_weight, values in strategy.evaluate(batch, run.precision, weight):
                    sums.add(values, part_weight)
                continue
            if is_real:
                hooks.call("on_validation_batch_start", batch, index, *extra)
            with logs.micro_batch(weight):
                outputs = step(batch, index)
            if reduces_outputs:  # (Lightning's Trainer: what the step returns is the user's, not a metric)
                loss, metrics = split_step_output(outputs, "validation_step")
                if loss is not None:
                    metrics["loss"] = loss
                sums.add(metrics, weight)
            if is_real:
                hooks.call("on_validation_batch_end", outputs, batch, index, *extra)
            step_logs.after_batch()
    step_logs.finish()
    logs.use_dataloader(None)
    bar.close()


def require_validation_data(run: RankRun) -> None:
    """``Trainer.validate`` on a module without validation data is an error, not an empty result."""
    if run.val_set is None:
        raise ValueError(f"Trainer.validate: {type(run.module).__name__} has no validation data; define "
                         "val_dataset() or val_dataloader() (and validation_step())")
