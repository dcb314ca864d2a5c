"""``Trainer.test`` and ``Trainer.predict`` on one rank: a pass over the test / predict set.

The set is cut into batches in dataset order (batch b holds samples ``b*B .. (b+1)*B - 1``, the
last one short), the same batches on any world size; rank r runs batches r, r + W, r + 2W ...
(every sample exactly once, no padding duplicates). ``test`` reduces the metrics like validation
(sample-weighted sums, one all-reduce: exact means over the set); ``predict`` gathers every
batch's output to rank 0 and returns them as a list in batch order. Strategies whose forward is
a collective (FSDP) run in lockstep: short ranks run extra forwards of batch 0 that count for
nothing. The pipeline strategy is refused before any worker starts (``trainer/entry_points.py``).

A stream (an ``IterableDataset``, or an iterable of ready batches) is read as the pass
goes, in batches of the loader's batch size, rank r running batches r, r + W, ... of it (every rank
reads it; ``test`` under ``data.stream_mode=sharded`` reads its own shards), so ``batch_idx`` and the
order of ``predict``'s outputs are the stream's; ``trainer.num_test_batches`` is known at its end.

``limit_test_batches`` / ``limit_predict_batches`` keep the first N of these batches (a float: that
fraction of them), so the same batches on any world size; 0 skips the pass: no data is read, no
hook runs, ``test`` returns ``{}`` and ``predict`` None (as Lightning).
"""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Iterator

import torch
from torch.utils.data import IterableDataset

from trainer.api.hook_calls import call_step, require_dataloader_idx
from trainer.runtime import distributed
from trainer.loop.resume import load_for_evaluation
from trainer.runtime.seeding import derive_seed, seeded
from trainer.data.loaders import build_loader
from trainer.runtime.metric_sums import WeightedSums, format_metrics, split_step_output
from trainer.loop.grad_mode import evaluation_grad_mode
from trainer.loop.log_collector import merge_logged
from trainer.observe.progress import ProgressBar
from trainer.runtime.tensors import move_to_device
from trainer.loop.eval_modes import EvalModes
from trainer.loop.eval_step_logs import EvalStepLogs
from trainer.loop.optimizer_step import transfer_batch
from trainer.data.loader_reading import _collate, check_map_style, kept_samples, read_loader
from trainer.data.streaming.validation import StreamValShard
from trainer.data.val_data import several_loaders
from trainer.api.errors import MisconfigurationException
from trainer.loop.validation import require_validation_data
from trainer.loop.run_limits import disables, eval_sample_limit

if TYPE_CHECKING:
    from trainer.loop.rank_run import RankRun

log = logging.getLogger(__name__)


def run_evaluation(run: RankRun, mode: str) -> Any:
    """``validate`` / ``test`` / ``predict`` on this rank, after the run's set-up: the weights of
    ``ckpt_path`` if given (its step too), then the pass."""
    if mode == "validate":
        require_validation_data(run)
    run.enter_stage(mode)  # (validate: the validation pass sets it again)
    # The trainer keeps its progress (as Lightning: metrics are logged at the fitted step); the step
    # of a ckpt_path's checkpoint replaces it.
    step, global_step, epoch = run.trainer.stored_progress()
    run.show(step, global_step, epoch)  # (a manual fit's global_step differs)
    load_for_evaluation(run)
    if mode == "validate":
        return run.validate()
    if disables(getattr(run.trainer, f"limit_{mode}_batches")):
        log.info("trainer.limit_%s_batches=0: the %s pass is skipped", mode, mode)
        return {} if mode == "test" else None
    return run_test(run) if mode == "test" else run_predict(run)


def eval_batches(num_samples: int, batch_size: int, rank: int, world_size: int) -> list[tuple[int, list[int]]]:
    """Rank ``rank``'s ``(batch index, sample indices)``: dataset-order batches dealt round robin."""
    starts = range(rank * batch_size, num_samples, world_size * batch_size)
    return [(start // batch_size, list(range(start, min(start + batch_size, num_samples)))) for start in starts]


class EvalData:
    """One test or predict loader of a run (``loader`` None: the ``<stage>_dataset()`` hook's data)."""

    def __init__(self, run: RankRun, stage: str, loader: Any, where: str):
        module, trainer = run.module, run.trainer
        setting = getattr(trainer, f"limit_{stage}_batches")
        user = read_loader(loader, where, stream_ok=True, limit=(f"limit_{stage}_batches", setting)) \
            if loader is not None else None
        self.dataset = user.dataset if user is not None else getattr(run.data.hooks, f"{stage}_dataset")()
        if self.dataset is None:
            raise ValueError(f"Trainer.{stage}: {type(run.data.hooks.source[stage]).__name__} has no {stage} data; define "
                             f"{stage}_dataset() or {where} (on the module, or on a DataModule passed as datamodule=)")
        #: a stream (an IterableDataset, or an iterable of ready batches): read as the pass goes
        self.stream = isinstance(self.dataset, IterableDataset)
        if user is None:
            check_map_style(self.dataset, f"{stage}_dataset()", stream_ok=True)
            # As the training data is loaded (data.batch_size, the module's collate_fn, data.* workers).
            self.batch_size, self.options, self.collate = trainer.batch_size, run.data.train_options, module.collate_fn
            self.size = stream_sample_limit(setting, self.batch_size, self.dataset, f"{stage}_dataset()", stage) \
                if self.stream else eval_sample_limit(setting, self.batch_size, len(self.dataset))
            return
        if self.stream:
            if user.drop_last:
                raise ValueError(f"{where}: drop_last=True cannot be honoured for a stream (an IterableDataset): "
                                 f"{stage} runs over every sample once; remove drop_last")
            self.batch_size, self.options = user.batch_size, user.options
            self.collate = _collate(module, user.collate_fn, where)
            self.size = stream_sample_limit(setting, self.batch_size, self.dataset, where, stage)
            return
        #: the samples run: all, or with drop_last all but the short last batch (as one process)
        self.size = kept_samples(len(self.dataset), user.batch_size, user.drop_last, where)
        if user.sampler is not None or (stage == "predict" and user.shuffle):
            what = type(user.sampler).__name__ if user.sampler is not None else "shuffle=True"
            raise ValueError(f"{where}: {what} cannot be honoured: {stage} runs over every sample once in dataset "
                             "order" + (" (the outputs come back in that order)" if stage == "predict" else "")
                             + "; remove it (a subset: pass a torch.utils.data.Subset as the dataset)")
        # test: shuffle=True is accepted and changes nothing, the metrics being means over the whole set.
        self.batch_size, self.options = user.batch_size, user.options
        self.collate = _collate(module, user.collate_fn, where)
        self.size = eval_sample_limit(getattr(trainer, f"limit_{stage}_batches"), self.batch_size, self.size)


def stream_sample_limit(setting: Any, batch_size: int, dataset: Any, where: str, stage: str) -> int | None:
    """The first samples of a stream a pass runs under ``limit_<stage>_batches`` (None: to its end); a
    fraction needs the stream's ``__len__`` (Lightning's error without one)."""
    if setting is None or (isinstance(setting, float) and setting == 1.0):
        return None
    if not isinstance(setting, float):
        return setting * batch_size
    try:
        length = len(dataset)
    except TypeError:
        raise MisconfigurationException(
            f"{where} gave {type(dataset).__name__}, an `IterableDataset` without a length: `Trainer(limit_{stage}_"
            f"batches)` must be `1.0` or an int (a count of batches), not the fraction {setting}") from None
    return eval_sample_limit(setting, batch_size, length)


def _stream_batches(run: RankRun, stage: str, data: EvalData) -> Iterator[tuple[int, int, Any]]:
    """``(batch index, weight, collated batch)`` of this rank's part of a stream, read as the pass goes:
    every rank reads the stream (``predict``: always, so the outputs come back in stream order) and runs
    batches r, r + W, ...; ``test`` under ``data.stream_mode=sharded`` reads its own shards. A lockstep
    strategy pads to the busiest rank (weight 0, index 0)."""
    source = SimpleNamespace(trainer=run.trainer, val_set=data.dataset, val_batch_size=data.batch_size,
                             val_collate=data.collate, val_options=data.options)
    shard = StreamValShard(source, 0, run.data_rank, run.data_parallel_size, data.size,
                           mode="invariant" if stage == "predict" else None)
    if run.strategy.lockstep_forward:
        shard = shard.padded_to_the_busiest()
    real = 0
    for weight, batch, is_real in shard.weighted():
        yield (real * run.data_parallel_size + run.data_rank if is_real else 0), weight, batch
        real += is_real
    data.real = real


def eval_data(run: RankRun, stage: str) -> list[EvalData]:
    """The test or predict loaders of a run, read from the data hooks (the datamodule's where it has
    them) under the seed every rank shares for that stage: one, or several (a list, tuple or dict of
    DataLoaders, run one after the other, each with its own plan: ``dataloader_idx`` 0, 1, ...)."""
    hooks, where = run.data.hooks, run.data.hooks.where[stage]
    with seeded(derive_seed(run.trainer.seed, "data", stage)):
        loader = run.data.returned[stage] = getattr(hooks, f"{stage}_dataloader")()
        loaders = several_loaders(loader)
        if loaders is None:
            return [EvalData(run, stage, loader, where)]
        if not loaders:
            raise ValueError(f"{where} returned no DataLoader (an empty {type(loader).__name__}); return at least one")
        return [EvalData(run, stage, each, f"{where}[{i}]") for i, each in enumerate(loaders)]


def _pass(run: RankRun, stage: str, on_output: Any) -> tuple[EvalModes, list[int | None]]:
    """Run ``<stage>_step`` over this rank's batches of each loader with Lightning's hooks up to
    ``on_<stage>_epoch_end``; ``on_output(dataloader_idx, batch_index, weight, output)`` for each
    (weight 0: a lockstep filler whose output counts for nothing, and that no batch hook sees). The
    caller ends the pass: ``on_<stage>_end``, then the returned modes' ``exit()``. Returns the modes
    and the loaders' ``dataloader_idx`` ([None]: one loader)."""
    datas = eval_data(run, stage)
    indices: list[int | None] = list(range(len(datas))) if len(datas) > 1 else [None]
    if len(datas) > 1:
        require_dataloader_idx(run.module, f"{stage}_step", f"{stage}_dataloader", len(datas))
    counts = run.num_eval_batches[stage] = []  # (Lightning's trainer.num_test_batches / num_predict_batches)
    for data in datas:  # (a stream's: known at its end; until then its limit's, or inf)
        counts.append(math.inf if data.stream and data.size is None else
                      len(eval_batches(data.size, data.batch_size, run.data_rank, run.data_parallel_size)))
    modes = EvalModes(run.hooks, stage)
    modes.enter()
    run.hooks.call(f"on_{stage}_start")
    run.hooks.call(f"on_{stage}_epoch_start")
    for i, (dataloader_idx, data) in enumerate(zip(indices, datas)):
        _loader_pass(run, stage, data, dataloader_idx, on_output)
        if data.stream:
            counts[i] = data.real
    run.strategy.after_evaluation(run.wrapped)
    run.hooks.call(f"on_{stage}_epoch_end")
    return modes, indices


def _loader_pass(run: RankRun, stage: str, data: EvalData, dataloader_idx: int | None, on_output: Any) -> None:
    """One loader's batches (``dataloader_idx`` None: the stage's only loader, as Lightning, not passed)."""
    module, strategy, hooks = run.module, run.strategy, run.hooks
    extra = () if dataloader_idx is None else (dataloader_idx,)  # the steps' and batch hooks' last argument
    if data.stream:
        batches, most = _stream_batches(run, stage, data), None
    else:
        mine = eval_batches(data.size, data.batch_size, run.data_rank, run.data_parallel_size)
        weights = [len(indices) for _, indices in mine]
        most = len(eval_batches(data.size, data.batch_size, 0, run.data_parallel_size))  # rank 0's: the busiest
        if strategy.lockstep_forward:
            # Every rank runs as many forwards as rank 0; the extra ones re-read sample 0.
            mine += [(0, [0])] * (most - len(mine))
            weights += [0] * (most - len(weights))
        seed = derive_seed(run.trainer.seed, stage, run.data_rank, *extra)
        loader = build_loader(data.dataset, [indices for _, indices in mine], data.collate, data.options, seed)
        batches = ((index, weight, batch) for (index, _), weight, batch in zip(mine, weights, loader))
    if strategy.lockstep_forward:
        def forward(batch: Any, index: int) -> Any:
            return run.wrapped(batch, index, f"{stage}_step", *extra)
    else:
        def forward(batch: Any, index: int) -> Any:
            return call_step(module, f"{stage}_step", batch, index, *extra)
    bar = ProgressBar(None if data.stream else len(mine), run.trainer.progress_bar if run.rank == 0 else False,
                      desc=stage, unit="batch",
                      leave=False)
    step_logs = EvalStepLogs(run, stage, most, True, dataloader_idx)  # self.log(on_step=True) (test; predict refuses it)
    logs = run.module_logs
    logs.use_dataloader(dataloader_idx)  # self.log names get "/dataloader_idx_N" with several loaders
    with evaluation_grad_mode(run):
        for index, weight, batch in batches:
            bar.update()
            batch = run.precision.convert_input(transfer_batch(run, batch, dataloader_idx=dataloader_idx or 0))
            if weight:
                hooks.call(f"on_{stage}_batch_start", batch, index, *extra)
            with run.precision.autocast(run.device), logs.micro_batch(weight):
                output = forward(batch, index)
            on_output(dataloader_idx, index, weight, output)
            if weight:
                hooks.call(f"on_{stage}_batch_end", output, batch, index, *extra)
            step_logs.after_batch()
    step_logs.finish()
    logs.use_dataloader(None)
    bar.close()


def run_test(run: RankRun) -> dict[str, float]:
    """``Trainer.test`` on this rank: the ``test/`` metrics, exact means over the test set (logged)."""
    with evaluation_grad_mode(run):  # the whole pass, its hooks included (as Lightning)
        return _run_test_pass(run)


def _run_test_pass(run: RankRun) -> Any:
    sums: dict[int | None, WeightedSums] = {}

    def add(dataloader_idx: int | None, index: int, weight: int, output: Any) -> None:
        if not getattr(run.trainer, "reduces_eval_outputs", True):  # (Lightning's: the output is the user's)
            return
        loss, metrics = split_step_output(output, "test_step")
        if loss is not None:
            metrics["loss"] = loss
        sums.setdefault(dataloader_idx, WeightedSums(run.device)).add(metrics, weight)

    logs = run.module_logs
    with logs.stage("test"):  # self.log in test_step: aggregated over the whole test set
        modes, loaders = _pass(run, "test", add)
        metrics: dict[str, float] = {}
        for dataloader_idx in loaders:  # (every rank reduces each loader's sums, its own possibly empty)
            suffix = "" if dataloader_idx is None else f"/dataloader_idx_{dataloader_idx}"
            reduced = sums.get(dataloader_idx, WeightedSums(run.device)).reduce("test/", run.strategy,
                                                                                some_ranks_may_be_empty=True)
            metrics.update({name + suffix: value for name, value in reduced.items()})
        merge_logged(metrics, logs.epoch_metrics("test", run.strategy), logs)
    if metrics:
        run.log(metrics)
        log.info("test at step %d  %s", run.step, format_metrics(metrics))
    run.hooks.call("on_test_end")
    modes.exit()
    return metrics


def run_predict(run: RankRun) -> list[Any] | None:
    """``Trainer.predict`` on this rank: on rank 0 the list of every batch's ``predict_step`` output
    (on the CPU) in batch order; None on the other ranks. Also kept as ``run.predictions``."""
    with evaluation_grad_mode(run):  # the whole pass, its hooks included (as Lightning)
        return _run_predict_pass(run)


def _run_predict_pass(run: RankRun) -> Any:
    outputs: list[tuple[int, Any]] = []
    if not getattr(run.trainer, "return_predictions", True):  # predict(return_predictions=False): nothing kept
        _pass(run, "predict", lambda dataloader_idx, index, weight, output: None)
        return None

    def keep(dataloader_idx: int | None, index: int, weight: int, output: Any) -> None:
        if weight:
            outputs.append(((dataloader_idx, index), move_to_device(output, torch.device("cpu"))))

    modes, loaders = _pass(run, "predict", keep)
    run.hooks.call("on_predict_end")
    modes.exit()
    gathered = distributed.gather_object(outputs)  # one collective at the end, not per batch
    if gathered is not None:
        # Keyed by batch index: the ranks of one tensor-parallel group (strategy=nd) predict the same batches.
        merged = {key: output for part in gathered for key, output in part}
        if loaders == [None]:
            return [merged[key] for key in sorted(merged, key=lambda key: key[1])]
        # several loaders: a list of each loader's outputs (Lightning's shape)
        return [[merged[key] for key in sorted(k for k in merged if k[0] == idx)] for idx in loaders]
    return None
