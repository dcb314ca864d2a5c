"""A rank's run, built in one place and one order: ``build_run`` installs the parts every call (fit,
validate, test, predict) uses; ``trainer/loop/fit_build.py`` adds what only ``fit`` needs.

The order (the docs' architecture page shows the same list):

1. environment and mesh: the process group, the device, the data-parallel size and rank, the run
   directory (rank 0's, under torchrun every rank built its own Trainer);
2. the callbacks and the hook dispatcher (the module's ``configure_callbacks`` joins the Trainer's),
   and what ``self.log`` collects;
3. prepare_data, setup: ``prepare_data`` once per node, then ``setup`` on every rank, under the seed
   every rank shares;
4. the model: ``configure_model`` (meta init under a strategy that shards it), eager initialisation,
   precision, tensor parallel, activation checkpointing, compile, SyncBatchNorm;
5. the data: the module's data hooks, resolved into the run's batch settings (after
   ``configure_model``: Lightning asks for the loaders after it too, and a strategy's wrap may need
   the batch size);
6. summary, wrap, per-rank random streams, init_from: the model summary, the strategy's wrap (FSDP /
   DDP / pipeline stages; a meta build is materialised unit by unit), each rank's own random stream,
   ``init_from``'s weights;
7. the loggers (rank 0 writes; every rank agrees on their versions), with the hyperparameters.

Nothing here writes into the Trainer: the Trainer holds configuration, the parts hold the run.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from trainer.api.hparams import for_loggers, merged_for_loggers
from trainer.api.hparams_archive import HparamsArchive
from trainer.callbacks import CallbackList
from trainer.checkpoint import load_weights
from trainer.checkpoint.safetensors_dir import is_safetensors_dir, load_safetensors_dir
from trainer.data.user_loader import RunData
from trainer.loggers import Logger, agree_versions
from trainer.loggers.tensorboard_graph import log_graphs
from trainer.loggers.wandb_run_id import adopt_run_of_checkpoint
from trainer.loop.data_reload import deferred_val_read
from trainer.loop.hooks import RunHooks
from trainer.loop.log_collector import LogCollector
from trainer.loop.sanity_check import sanity_pass_follows
from trainer.loop.validation import check_validation_setup
from trainer.observe.model_summary import summarize
from trainer.runtime import distributed
from trainer.runtime.rank_logging import log_to_file
from trainer.runtime.seeding import derive_seed, seed_everything
from trainer.strategies import Strategy
from trainer.strategies.speedups import apply_activation_checkpointing, compile_blocks
from trainer.strategies.sync_batchnorm import convert_sync_batchnorm, warn_if_nothing_to_sync
from trainer.strategies.weight_init import WeightInit, has_meta_tensors
from trainer.strategies.wrap_policy import select_units

if TYPE_CHECKING:
    from trainer.api.module import TrainModule
    from trainer.loop.rank_run import RankRun
    from trainer.trainer import Trainer


def build_run(run: RankRun) -> None:
    """Build one rank's run for ``trainer.stage``, in the order of the module docstring: each part is
    installed into ``run`` as soon as it exists (the hooks called during the build see the parts
    built before them) and is read-only from then on (``trainer/loop/run_parts.py``)."""
    trainer, module, strategy = run.trainer, run.module, run.strategy
    # 1. environment and mesh
    strategy.setup_environment(run.env, trainer.collective_timeout)
    rank = distributed.rank()
    run_dir = distributed.broadcast_object(trainer.run_dir)  # under torchrun every rank built its own Trainer
    run.install(device=strategy.device, rank=rank, data_parallel_size=strategy.data_parallel_size(),
                data_rank=strategy.data_parallel_rank, run_dir=run_dir)
    if rank == 0:
        os.makedirs(run_dir, exist_ok=True)
        if run.own_log_handler and (log_file_dir := trainer.log_files_dir(run_dir)) is not None:
            os.makedirs(log_file_dir, exist_ok=True)
            log_to_file(os.path.join(log_file_dir, "train.log"))
    module._trainer = trainer
    saves = (trainer.checkpoint is not None and trainer.checkpoint.enabled) or getattr(
        trainer.checkpoint_callback, "_files", False)  # Lightning's ModelCheckpoint writing files
    if rank == 0 and trainer.stage == "fit" and saves:
        # The objects among the hyperparameters, pickled for the checkpoints before the strategy changes the model.
        run.install(hparams_archive=HparamsArchive({"module": module, "datamodule": trainer.datamodule}))
    logged_hparams = merged_for_loggers(module, trainer.datamodule)  # every rank: a clash fails them all alike
    # 2. the callbacks and the hook dispatcher (and what self.log collects)
    refused = "not supported under strategy=pipeline; return the metric from pipeline_loss" if strategy.owns_step else None
    module_logs = module._log_collector = LogCollector(run.device, refused, module)
    callbacks = CallbackList(trainer.callbacks, trainer, module, run.view)
    callbacks.add_configured(module.configure_callbacks())
    hooks = RunHooks(trainer, module, trainer.datamodule, callbacks)
    callbacks.dispatch_with(hooks)  # the checkpoint hooks go through the same dispatcher
    run.install(module_logs=module_logs, callbacks=callbacks, hooks=hooks)
    # 3. prepare_data, setup
    with distributed.rank_zero_first(local=True) as first:
        if first:
            if trainer.datamodule is not None:
                trainer.datamodule.prepare_data()
            module.prepare_data()
    # Seeded right before setup and the build so every rank builds the same weights (prepare_data
    # ran on some ranks only and may have drawn random numbers); the datamodule's setup has its own seed.
    seed_everything(trainer.seed)
    hooks.call("setup", trainer.stage)  # datamodule, callbacks, module (every rank)
    # 4. the model
    init = _build_model(trainer, module, strategy)
    run.install(precision=trainer.precision)
    # 5. the data (before wrapping: a strategy may need the batch size)
    data = RunData(module, trainer, _sanity_read(run) if sanity_pass_follows(trainer) else None,
                   defer_val=deferred_val_read(trainer))
    run.install(data=data)
    run.replan(data.batch)  # the run's batch settings (the batch-size finder may choose others)
    if not data.evaluating and not data.val_pending:  # test / predict read no validation data
        check_validation_setup(trainer, module, data.val_set)
    # 6. summary, wrap, per-rank random streams, init_from
    run.install(summary=summarize(module) if trainer.enable_model_summary else None)
    strategy.use_batch(data.batch)
    run.install(wrapped=strategy.wrap(module, init))  # materialises a meta-device build, unit by unit
    # Different random streams per rank from here on (dropout; also each pipeline stage's own), one per
    # tensor-parallel group (strategy.random_stream_rank). Loading draws from its own per-batch seeds,
    # keyed by the data-parallel rank (RankRun.loader).
    seed_everything(derive_seed(trainer.seed, "rank", strategy.random_stream_rank))
    init_from = trainer.init_from if trainer.init_from is not None else _weights_of(module)
    if init_from is not None and is_safetensors_dir(init_from):
        load_safetensors_dir(init_from, module)  # each rank reads its own slices of the files
    elif init_from is not None:
        load_weights(init_from, module, part_of_model=strategy.owns_step)  # pipeline: this rank's stages
    # 7. the loggers
    run.install(loggers=_open_loggers(trainer, run_dir, rank, logged_hparams))
    log_graphs(run.loggers, module, strategy.name)  # (rank 0's; TensorBoardLogger(log_graph=True))


def _build_model(trainer: Trainer, module: TrainModule, strategy: Strategy) -> WeightInit:
    """``configure_model`` and what changes the model before the strategy wraps it, in torchtitan's
    order: precision, tensor parallel, activation checkpointing, compile; then SyncBatchNorm."""
    strategy.before_configure_model(module)  # (nd: module.device_mesh)
    with strategy.init_context():
        module.configure_model()
    init = WeightInit(module, trainer.seed)
    if not has_meta_tensors(module):
        module.to(strategy.device)
        init.eager()
    trainer.precision.convert_module(module)
    strategy.configure_precision(trainer.precision)
    strategy.parallelize(module)  # tensor parallel: before checkpointing, compile and sharding
    if trainer.activation_checkpointing or trainer.compile:
        blocks = select_units(module, "auto", module.block_classes())
        if trainer.activation_checkpointing:
            apply_activation_checkpointing(module, blocks)
        if trainer.compile:
            compile_blocks(module, blocks)
    if trainer.sync_batchnorm:
        warn_if_nothing_to_sync(module, strategy.data_parallel_size())
        # After the build and on its device (CUDA batch norms become torch's nn.SyncBatchNorm),
        # before wrapping, so DDP / FSDP register the synchronised layers. The default group is
        # the data-parallel group of DDP and FSDP (hybrid included).
        convert_sync_batchnorm(module, process_group=None)
    return init


def _weights_of(module: TrainModule) -> str | None:
    """The weights a module starts from by itself (a Hugging Face module's directory), or None."""
    hook = getattr(module, "initial_weights", None)
    return hook() if callable(hook) else None


def _open_loggers(trainer: Trainer, run_dir: str, rank: int, logged_hparams: Any) -> list[Logger]:
    """Rank 0's loggers, with the hyperparameters logged; every rank agrees on their versions first."""
    agree_versions(trainer.logger_objects(run_dir))  # every rank holds the logger objects (self.logger)
    if rank != 0:
        return []
    source = trainer.ckpt_path or trainer.resume  # (fit's ckpt_path= or trainer.resume)
    if source not in (None, "auto", "last", "best"):
        adopt_run_of_checkpoint(source, run_dir)  # resumed into a new run directory: the checkpoint's W&B run goes on
    loggers = trainer.logger_objects(run_dir)
    loggers = loggers + trainer.record_loggers(loggers, run_dir)  # (the trainer's own, not trainer.loggers)
    for logger in loggers:
        logger.open_in_run()
    params = for_loggers(trainer.config, logged_hparams)  # the config and save_hyperparameters()'s
    if params is not None:
        for logger in loggers:
            logger.log_hyperparams(params)
    return loggers


def _sanity_read(run: Any) -> Any:
    """Where a sanity pass follows, ``val_dataloader()`` is read first, for it (Lightning's order:
    ``trainer.sanity_checking`` is true in the hook)."""
    return lambda: run.stage("sanity_check", sanity=True)
