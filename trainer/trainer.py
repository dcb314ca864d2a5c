"""Trainer: what to train how long, on how many processes. The per-rank loop is in ``loop.py``."""

from __future__ import annotations

import logging
import os
import time
from datetime import timedelta
from typing import Any, Mapping, Sequence

from trainer.loop.batch_size_finder import AutoBatchSize
from trainer.callbacks import Callback, check_callbacks
from trainer.checkpoint.config import CheckpointConfig
from trainer.api.lightning_names import (accelerator_name, check_precision, precision_name, resolve_devices,
                                         resolve_strategy_name, unknown_argument_error)
from trainer.loggers import DEFAULT_LOGGERS, Logger, choose_loggers, resolve_logger_specs
from trainer.loggers.trainer_loggers import TrainerLoggers
from trainer.callbacks.model_checkpoint import CHECKPOINT_DEFAULT, checkpointing
from trainer.call_launch import run_call
from trainer.entry_points import prepare_call
from trainer.runtime.launch import detect_environment
from trainer.trainer_checks import apply_run_limits, check_accelerator, check_strategy_settings, devices_for, with_timer
from trainer.api.module import TrainModule
from trainer.precision import Precision
from trainer.api.run_state import TrainerRunState
from trainer.api.trainer_resolved import TrainerResolvedSettings
from trainer.api.batch_settings import BatchArguments, resolve_batch
from trainer.strategies import Strategy, resolve_strategy
from trainer.data.streaming.protocol import MODES as STREAM_MODES
from trainer.api.trainer_arguments import check_arguments, check_lightning_flags, profile_options
from trainer.runtime.value_checks import is_int, require
from trainer.data.user_loader import DEFAULT_BATCH_SIZE

log = logging.getLogger(__name__)

class Trainer(TrainerResolvedSettings, TrainerRunState, TrainerLoggers):
    """Runs ``fit`` / ``validate`` / ``test`` / ``predict`` for a `TrainModule` with a strategy plugin.

    Args:
        strategy: "single", "ddp", "auto" (single for one process in all, else ddp), or a Strategy
            instance (``DDPStrategy(zero1=True)``).
        devices: processes per node, or "auto" (the launcher's processes per node under torchrun /
            srun, else the CUDA device count when CUDA is used, else 1). With no launcher and
            ``devices > 1`` the trainer spawns them itself; under a launcher it checks they match.
        num_nodes: nodes; > 1 needs torchrun ``--nnodes`` or SLURM.
        accelerator: "auto" (GPU if present), "cpu" or "cuda" ("gpu" means "cuda"; "mps", "tpu",
            "hpu" are refused).
        max_steps: optimizer steps to run, ``global_step`` (-1: no limit, then ``max_epochs`` decides);
            under manual optimization the module's ``opt.step()`` calls: the run stops after the
            batch that reaches it (trainer/loop/step_limits.py).
        max_epochs: epochs to run (None with ``max_steps=-1``: one epoch).
        max_time: also stop after this much training time: "DD:HH:MM:SS", seconds, ... (adds a
            `Timer` after the other callbacks; None: no limit).
        batch_size: samples per rank per micro-batch (``data.batch_size``). None (unset): the
            ``batch_size`` of the module's ``train_dataloader()`` if it returns one, else 32; set
            and different from the loader's: an error naming both. ``trainer.batch_size`` holds
            the resolved value once ``fit`` started.
        global_batch_size: optional; if given, ``accumulate_grad_batches`` follows from it and it
            must equal ``batch_size x accumulate x world size`` exactly.
        accumulate_grad_batches: micro-batches per optimizer step; gradients sync on the last only.
        gradient_clip_val: clip the gradients to this value (None: no clipping), by
            ``gradient_clip_algorithm``.
        log_every_n_steps: reduce and log metrics every this many optimizer steps.
        val_every_n_steps: validate every this many steps (None: only at the end of training).
        seed: seeds the model initialisation, the sample order and the data-loader workers.
        loss_normalization: "samples" (the step's loss is the mean over the global batch's samples)
            or "tokens" (``training_step`` returns "num_tokens" and the loss is the mean over all
            tokens of the global batch, for variable-length batches).
        drop_last: drop a short last global batch of an epoch instead of training on it. None
            (unset): the ``drop_last`` of ``train_dataloader()``'s loader, else False; set and
            different from the loader's: an error.
        num_workers: the DataLoader's worker processes; None (unset): ``train_dataloader()``'s, else
            0; set and different from the loader's: an error. What else is taken from a user's
            DataLoader, and what is refused: ``trainer/data/user_loader.py``.
        pin_memory: the DataLoader's ``pin_memory``; None (unset): ``train_dataloader()``'s, else
            False; set and different from the loader's: an error.
        stream_mode: for an ``IterableDataset`` (a stream): "invariant" (every rank reads the whole
            stream; equal to one process on any world size) or "sharded" (each rank reads its own
            shards; not equal to one process). See ``trainer/data/streaming/``.
        run_dir: where logs go (Hydra's run directory under ``train.py``; default ``runs/<time>``).
        loggers: metric sinks, built on rank 0 only: names among "jsonl", "csv", "tensorboard",
            "wandb" (``["jsonl", "csv"]``), ``{name: options}`` (``{"wandb": {"project": "p"}}``, what
            ``conf/logger/`` composes to), Logger instances, or a list mixing them. An unknown name
            or option fails here. Keep "jsonl" for ``metrics.jsonl``. Default: tensorboard, then jsonl.
        logger: Lightning's: True (the default loggers), False (none), a Logger (``TensorBoardLogger(save_dir)``,
            ``CSVLogger``, ``WandbLogger``) or a list of them; giving ``loggers`` too is an error.
            ``trainer.loggers`` / ``trainer.logger`` are the run's Logger objects (the list / the first).
        progress_bar: tqdm on rank 0 (None: only when stderr is a terminal).
        deterministic: True: ``torch.use_deterministic_algorithms(True)`` on every rank during each
            call; "warn": warn-only; False: off; None: as it is. Restored after each call
            (``trainer/runtime/torch_flags.py``).
        collective_timeout_s: any collective that waits longer fails instead of hanging.
        sync_batchnorm: replace BatchNorm1d/2d/3d by batch norms whose statistics span all
            data-parallel ranks (works on CPU / gloo too); see ``trainer/strategies/sync_batchnorm.py``.
        precision: "fp32" (default), "bf16-mixed", "fp16-mixed" (with loss scaling) or "bf16-true",
            or a `Precision` with the loss-scaler settings. Lightning's
            names mean the same: "32" / "32-true" / 32, "16-mixed" / 16, "bf16-mixed", "bf16-true".
        activation_checkpointing: recompute the activations of each block (``block_classes()``) in backward.
        compile: ``torch.compile`` each block.
        nonfinite_loss: "error" (a NaN / inf loss stops the run, naming the step and rank) or "ignore".
            Checked without a per-step host sync: the flag stays on the device and is read on logging
            steps, before validation and before every checkpoint save (a NaN state is never saved),
            so the run may go on up to ``log_every_n_steps - 1`` steps past the bad one; the error
            names the bad step. Under ``precision="fp16-mixed"`` an infinite loss is an overflow the
            loss scaler handles (the step is skipped, the scale lowered), but a NaN loss is an error:
            lowering the scale cannot fix a NaN forward.
        profile: ``{"wall_clock_breakdown": bool, "trace_steps": [first, last], "comms_steps": [first, last]}``:
            per-phase step times (``time/*`` metrics; synchronises CUDA, so off by default), a
            torch.profiler trace, and a log of the collectives over those steps (``<run_dir>/comms/``).
        checkpoint: when and how to save (a CheckpointConfig or its fields as a dict; None: never). Not
            given: a ``ModelCheckpoint`` among ``callbacks`` decides, else Lightning's default (a checkpoint
            at every epoch end and at the end, the newest kept, in ``<run_dir>/checkpoints``;
            ``trainer/callbacks/model_checkpoint.py``). ``train.py`` always gives it (``conf/config.yaml``).
        enable_checkpointing: Lightning's: False turns the default checkpointing off.
        resume: "auto" (the latest complete checkpoint of the checkpoint dir, if any), a checkpoint
            directory or a directory of checkpoints; None starts from scratch. ``fit`` / ``validate``
            take the same per call as ``ckpt_path=`` ("last" = auto); given both, they must agree.
        init_from: a full state dict file (read on rank 0 only) or a directory of HF safetensors (each rank its slices).
        return_weights: after ``fit`` in workers the trainer spawned, copy the trained full weights
            (parameters and buffers, gathered once by rank 0 through a file in the run directory)
            into the module passed to ``fit``. False: for models too big for one process's memory;
            the module keeps its initial weights, and ``validate(module)`` then needs ``ckpt_path``.
        callbacks: `Callback` instances (LearningRateMonitor, EarlyStopping,
            Timer, your own), called before the module's hook of the same name (Lightning's order), in this order (what
            ``conf/callbacks/`` composes to). With spawned workers each rank trains its own copies.
        config: the resolved configuration, recorded by the loggers (with the module's
            ``save_hyperparameters()`` under "hparams").
        enable_model_summary: log the model summary table (parameters per top-level child module,
            trainable / frozen / total, size in MB, each rank's share when split) at the start of fit.
        auto_batch_size: run the batch-size finder at the start of fit (single, ddp, fsdp): measured
            trial steps pick the largest micro-batch whose peak memory is at most
            ``auto_batch_size_limit_gb x (1 - auto_batch_size_margin)``, up to ``auto_batch_size_max``;
            ``batch_size`` holds the choice once fit started (``trainer/loop/batch_size_finder.py``).
        auto_batch_size_limit_gb: the finder's memory limit in GiB (required on CPU; None on CUDA: the
            device's memory).
        auto_batch_size_margin: the fraction of the finder's limit kept free, in [0, 1).
        auto_batch_size_max: the largest micro-batch the finder tries (None: no bound but the data).
        fast_dev_run: Lightning's: True or n runs n optimizer steps of one epoch and n validation
            batches, with no sanity pass, no checkpoints and no loggers; False / 0: off.
        limit_train_batches: Lightning's: an int counts optimizer steps (global batches) per epoch; a
            float in (0, 1] is that fraction of the epoch's steps (None: all; 0: fit trains nothing).
        limit_val_batches: Lightning's: an int counts global validation batches (the same samples on
            any world size); a float in (0, 1] is that fraction of the validation samples (None: all;
            0: no validation, no sanity pass).
        limit_test_batches: Lightning's: the first N global test batches (a float: that fraction; 0: no pass).
        limit_predict_batches: Lightning's: the first N global predict batches (a float: that fraction; 0: no pass).
        overfit_batches: Lightning's: train and validate on the first N batches of each set (a float: that
            fraction), both in dataset order; it wins over ``limit_train/val_batches`` (0: off).
        min_epochs: Lightning's: a stop (EarlyStopping, ``should_stop``) waits until this many epochs finished.
        min_steps: Lightning's: a stop waits until ``global_step`` reached this (None: no minimum).
        detect_anomaly: ``torch.autograd.set_detect_anomaly(True)`` on every rank during each call, restored after.
        val_check_interval: Lightning's: an int is ``val_every_n_steps``; a float in (0, 1] validates
            every that fraction of an epoch's steps.
        check_val_every_n_epoch: Lightning's: also validate at the end of every N epochs (None: not
            at epoch ends).
        num_sanity_val_steps: Lightning's: global validation batches run before the first step, so
            that a broken ``validation_step`` fails at once (-1: all, 0: none; default 2, as Lightning).
        default_root_dir: Lightning's name for ``run_dir``; both given and different: an error. The
            units of these Lightning arguments (world-size independent) are in
            ``trainer/loop/run_limits.py``'s docstring.
        enable_progress_bar: Lightning's name for ``progress_bar``; both given: they must agree.
        benchmark: ``torch.backends.cudnn.benchmark`` on every rank during each call (None: as it
            is; False when ``deterministic`` is set). Restored after each call.
        inference_mode: validation / test / predict under ``torch.inference_mode()`` (False:
            ``torch.no_grad()``; FSDP and pipeline: always no_grad, ``trainer/loop/grad_mode.py``).
        gradient_clip_algorithm: how ``gradient_clip_val`` clips: "norm" (None, the default: the
            global gradient 2-norm over every rank's shards) or "value" (each gradient element to
            ``[-val, val]``).
        **unknown_arguments: none is accepted: another argument (Lightning's ``profiler=``, a typo)
            is a TypeError naming ours (``trainer/api/lightning_names.py``).

    Run state during and after a run (``trainer/api/run_state.py``): ``global_step``, ``current_epoch``,
    ``is_global_zero``, ``logged_metrics``, ``callback_metrics``, ``log_dir``, ``optimizers``,
    ``lr_schedulers``, ``estimated_stepping_batches``, ``should_stop`` (settable).

    After ``fit`` returns, the caller may rely on: ``trainer.global_step`` (optimizer steps),
    ``trainer.current_epoch``, ``trainer.logged_metrics`` / ``trainer.callback_metrics`` (the last
    logged value of each metric) and, for ``strategy=single`` or workers this trainer spawned, a
    module whose parameters and buffers hold the trained full weights (see ``return_weights``).
    Under torchrun / srun the caller is one rank: its module holds that rank's part of the state
    as the strategy keeps it (sharded under FSDP, its own stages under pipeline); so does the module
    of a one-process fsdp run (DTensor parameters).
    """

    def __init__(
        self,
        strategy: str | Strategy = "single",
        devices: int = 1,
        num_nodes: int = 1,
        accelerator: str = "auto",
        max_steps: int = -1,
        max_epochs: int | None = None,
        max_time: Any = None,
        batch_size: int | None = None,
        global_batch_size: int | None = None,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        log_every_n_steps: int = 10,
        val_every_n_steps: int | None = None,
        seed: int = 0,
        loss_normalization: str = "samples",
        drop_last: bool | None = None,
        num_workers: int | None = None,
        pin_memory: bool | None = None,
        stream_mode: str = "invariant",
        run_dir: str | None = None,
        loggers: str | Logger | Mapping | Sequence[str | Logger | Mapping] | None = DEFAULT_LOGGERS,
        logger: bool | Logger | Sequence[Logger] | None = None,
        progress_bar: bool | None = None,
        collective_timeout_s: float = 1800.0,
        sync_batchnorm: bool = False,
        precision: str | Precision | None = None,
        activation_checkpointing: bool = False,
        compile: bool = False,
        nonfinite_loss: str = "error",
        profile: Mapping[str, Any] | None = None,
        checkpoint: CheckpointConfig | Mapping[str, Any] | None = CHECKPOINT_DEFAULT,
        enable_checkpointing: bool | None = None,
        resume: str | None = None,
        init_from: str | None = None,
        return_weights: bool = True,
        callbacks: Callback | Sequence[Callback] | None = None,
        config: dict | None = None,
        enable_model_summary: bool = True,
        auto_batch_size: bool = False,
        auto_batch_size_limit_gb: float | None = None,
        auto_batch_size_margin: float = 0.1,
        auto_batch_size_max: int | None = None,
        fast_dev_run: bool | int = False,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        overfit_batches: int | float = 0.0,
        min_epochs: int | None = None,
        min_steps: int | None = None,
        detect_anomaly: bool = False,
        val_check_interval: int | float | None = None,
        check_val_every_n_epoch: int | None = None,
        num_sanity_val_steps: int = 2,
        default_root_dir: str | None = None,
        enable_progress_bar: bool | None = None,
        deterministic: bool | str | None = None,
        benchmark: bool | None = None,
        inference_mode: bool = True,
        gradient_clip_algorithm: str | None = None,
        **unknown_arguments: Any,
    ):
        if unknown_arguments:  # Lightning's names that differ from ours, typos: say what to use
            raise unknown_argument_error(unknown_arguments, Trainer.__init__)
        accelerator = accelerator_name(accelerator)
        progress_bar = check_lightning_flags(enable_progress_bar, progress_bar, deterministic, benchmark, inference_mode,
                                             gradient_clip_algorithm, detect_anomaly)
        #: Lightning's flags (trainer/runtime/torch_flags.py, trainer/loop/grad_mode.py)
        self.deterministic, self.benchmark, self.inference_mode = deterministic, benchmark, inference_mode
        self.detect_anomaly = detect_anomaly
        self.gradient_clip_algorithm = gradient_clip_algorithm or "norm"
        #: as given (None: not given), what an overridden configure_gradient_clipping receives (Lightning's)
        self.gradient_clip_algorithm_arg = gradient_clip_algorithm
        devices = resolve_devices(devices, accelerator, detect_environment(), self.cuda_device_count())
        strategy, strategy_options = resolve_strategy_name(strategy, devices, num_nodes)
        check_precision(precision)
        precision = precision_name(precision)
        check_arguments(
            devices=devices, num_nodes=num_nodes, batch_size=batch_size, accumulate_grad_batches=accumulate_grad_batches,
            max_steps=max_steps, max_epochs=max_epochs, log_every_n_steps=log_every_n_steps,
            val_every_n_steps=val_every_n_steps, gradient_clip_val=gradient_clip_val,
            loss_normalization=loss_normalization, num_workers=num_workers, drop_last=drop_last,
            pin_memory=pin_memory, collective_timeout_s=collective_timeout_s, resume=resume, init_from=init_from,
            nonfinite_loss=nonfinite_loss, return_weights=return_weights, enable_model_summary=enable_model_summary,
            seed=seed,
        )
        self.sync_batchnorm = sync_batchnorm
        self.precision = Precision.from_any(precision)
        self.activation_checkpointing = activation_checkpointing
        self.compile = compile
        self.nonfinite_loss = nonfinite_loss
        self.profile = profile_options(profile)
        self.resume = resume
        self.init_from = init_from
        self.return_weights, self.enable_model_summary = return_weights, enable_model_summary
        #: what the current fit / validate call loads: "last", "best", a path or None (``ckpt_path=``)
        self.ckpt_path: str | None = None
        #: progress of the last fit (validate / test / predict keep it, or take their checkpoint's step)
        self.global_step = 0
        self.current_epoch = 0
        self.logged_metrics: dict[str, float] = {}
        self.callback_metrics = self.logged_metrics
        self.callbacks = with_timer(check_callbacks(callbacks), max_time)
        check_accelerator(strategy, accelerator, self.cuda_device_count)
        self.strategy = resolve_strategy(strategy, accelerator=accelerator, **strategy_options)
        checkpoint, self._checkpoint_callback = checkpointing(  # Lightning's ModelCheckpoint / default checkpointing
            checkpoint, enable_checkpointing, self.callbacks, self.strategy.checkpoint_formats,
            configured=checkpoint is not CHECKPOINT_DEFAULT, default=self.default_checkpoint_class)
        if self._checkpoint_callback is not None:
            self._checkpoint_callback._trainer = self
        self.checkpoint = CheckpointConfig.from_any(checkpoint)
        self.devices, self.num_nodes = devices, num_nodes = devices_for(self.strategy, devices, num_nodes)
        self.world_size = devices * num_nodes
        self.strategy.check_world_size(self.world_size, devices)
        self.auto_batch_size = AutoBatchSize.from_arguments(auto_batch_size, auto_batch_size_limit_gb,
                                                            auto_batch_size_margin, auto_batch_size_max)
        self.auto_batch_size.check_strategy(self.strategy)
        check_strategy_settings(self.strategy, self.checkpoint, sync_batchnorm)
        #: data.batch_size / drop_last / num_workers / pin_memory ... as given (None: unset); a run resolves them
        #: against train_dataloader() (trainer/data/user_loader.py) into its own BatchSettings
        self.batch_arguments = BatchArguments(batch_size, drop_last, num_workers, pin_memory, global_batch_size,
                                              accumulate_grad_batches)
        # Until a run reads the module's loader, the defaults (checked now when the batch size is given).
        self._configured_batch = resolve_batch(
            self.batch_arguments, batch_size or DEFAULT_BATCH_SIZE, bool(drop_last),
            self.strategy.data_parallel_size(self.world_size), self.world_size, num_workers or 0, bool(pin_memory),
            final=batch_size is not None)
        if is_int(batch_size):  # checked now, not in every worker (a null one: once fit reads the loader)
            self.strategy.check_batch_size(batch_size, self.world_size)
        self.max_steps = max_steps
        self.gradient_clip_val = gradient_clip_val
        self.log_every_n_steps = log_every_n_steps
        self.val_every_n_steps = val_every_n_steps
        self.seed = seed
        self.loss_normalization = loss_normalization
        require(stream_mode in STREAM_MODES, f"data.stream_mode={stream_mode!r}: give one of {', '.join(STREAM_MODES)} "
                 "(invariant: every rank reads the whole stream; sharded: each rank its own shards)")
        self.stream_mode = stream_mode
        self.run_dir = run_dir or os.path.join("runs", time.strftime("%Y-%m-%d_%H-%M-%S"))
        #: the checked ``loggers`` / ``logger`` choice; ``trainer.loggers`` are the Logger objects built from it
        self.logger_specs = resolve_logger_specs(choose_loggers(logger, loggers, loggers is not DEFAULT_LOGGERS))
        self.progress_bar = progress_bar
        self.collective_timeout = timedelta(seconds=collective_timeout_s)
        self.config = config
        apply_run_limits(self, fast_dev_run, limit_train_batches, limit_val_batches, val_check_interval,
                         check_val_every_n_epoch, num_sanity_val_steps, default_root_dir, run_dir, max_epochs,
                         limit_test_batches, limit_predict_batches, overfit_batches, min_epochs, min_steps)
        #: the DataModule of the current (or last) call, and which entry point it is (fit ... predict)
        self.datamodule: Any = None
        self.stage: str | None = None
        #: this call's DataLoaders given as train_dataloaders= / val_dataloaders= / dataloaders=, by stage
        self.given_loaders: dict[str, Any] = {}
        self.return_predictions = True  # predict(return_predictions=False): nothing gathered

    # ----- entry points ----------------------------------------------------------------------------
    def fit(self, model: TrainModule | None = None, train_dataloaders: Any = None, val_dataloaders: Any = None,
            datamodule: Any = None, ckpt_path: str | None = None, *, module: TrainModule | None = None,
            ) -> dict[str, float] | None:
        """Train ``model`` (Lightning's arguments and order; ``module=`` is another name for ``model=``).
        Returns rank 0's last logged metrics (None on other ranks); afterwards the module holds the
        trained weights (see the class docstring).

        Args:
            train_dataloaders: one DataLoader, used as if the module's ``train_dataloader()``
                returned it (the same checks, the same global-batch plan); a DataModule here is taken
                as ``datamodule``.
            val_dataloaders: one DataLoader, used as if the module's ``val_dataloader()`` returned it.
            datamodule: a `DataModule` whose data hooks win over the module's.
            ckpt_path: resume from "last" (the latest checkpoint of ``checkpoint.dir``; none yet:
                start from scratch, as ``trainer.resume=auto``), "best" (by ``checkpoint.monitor``)
                or a checkpoint path. Giving ``trainer.resume`` too is an error unless both agree.
        """
        loaders = {"train_dataloaders": train_dataloaders, "val_dataloaders": val_dataloaders}
        return run_call(self, "fit", prepare_call(self, "fit", model, module, loaders, datamodule, ckpt_path))

    def validate(self, model: TrainModule | None = None, dataloaders: Any = None, ckpt_path: str | None = None,
                 verbose: bool = True, datamodule: Any = None, *, module: TrainModule | None = None,
                 ) -> dict[str, float] | None:
        """Run one validation pass; returns the metrics reduced over all ranks (rank 0).

        Args:
            model: None: the module (and datamodule) of this trainer's last ``fit``.
            dataloaders: one DataLoader, as if ``val_dataloader()`` returned it (or a DataModule).
            ckpt_path: validate the weights of "last", "best" (by ``checkpoint.monitor``) or a
                checkpoint path (``trainer.resume`` means the same); None: ``model``'s own weights.
            verbose: print the metrics as a table (rank 0).
        """
        module = prepare_call(self, "validate", model, module, {"dataloaders": dataloaders}, datamodule, ckpt_path, verbose)
        return run_call(self, "validate", module, verbose)

    def test(self, model: TrainModule | None = None, dataloaders: Any = None, ckpt_path: str | None = None,
             verbose: bool = True, datamodule: Any = None, *, module: TrainModule | None = None,
             ) -> dict[str, float] | None:
        """Run ``test_step`` over the test data (``dataloaders``, else ``test_dataset()`` /
        ``test_dataloader()``, the datamodule's first); returns the ``test/`` metrics, exact means
        over the set (rank 0; a dict, not Lightning's one-dict list). The other arguments as for
        ``validate``."""
        module = prepare_call(self, "test", model, module, {"dataloaders": dataloaders}, datamodule, ckpt_path, verbose)
        return run_call(self, "test", module, verbose)

    def predict(self, model: TrainModule | None = None, dataloaders: Any = None, datamodule: Any = None,
                return_predictions: bool | None = None, ckpt_path: str | None = None, *,
                module: TrainModule | None = None) -> Any:
        """Run ``predict_step`` over ``dataloaders`` (else ``predict_dataset()`` / ``predict_dataloader()``);
        returns (rank 0, or the caller of spawned workers) the list of every batch's output on the
        CPU, in dataset order: batch b holds samples ``b*B .. b*B+B-1`` whatever the world size, each
        sample once. ``return_predictions=False``: nothing is gathered or kept, None is returned
        (for ``predict_step`` s that write their outputs themselves)."""
        if return_predictions not in (None, True, False):
            raise ValueError(f"Trainer.predict: return_predictions={return_predictions!r}; give True, False or None")
        module = prepare_call(self, "predict", model, module, {"dataloaders": dataloaders}, datamodule, ckpt_path)
        self.return_predictions = return_predictions is not False
        return run_call(self, "predict", module)
