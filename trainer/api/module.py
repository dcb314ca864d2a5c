"""TrainModule: the hooks a user overrides.

The whole loop, with every hook where it fires (``Trainer.fit``). Hooks that callbacks share run on
the callbacks first, then on the module (Lightning's order; the table: ``trainer/api/hook_table.py``)::

    launcher process:  Trainer(...) validates the config; module.__init__ ran already;
        fit(...) checks the call (trainer/entry_points.py), then runs it here or in spawned workers
    every rank, build_run (trainer/loop/run_build.py):
        process group, device, run directory
        module.configure_callbacks()          # callbacks it brings (replacing the Trainer's of their class)
        datamodule.prepare_data(); module.prepare_data()   # local rank 0 of each node only; the others wait
        seed_everything(seed)
        setup(stage): datamodule (under the data seed), callbacks, module
        module.configure_model()              # build layers here (or in __init__); on the meta device
                                              # with strategy.meta_init=true
        module.init_weights(submodule)        # per submodule, if overridden (or on a meta build)
        precision, tensor parallel, activation checkpointing, compile, SyncBatchNorm
        module.train_dataloader(); module.val_dataloader() or module.val_dataset()   # the data hooks run
                                              # here, under one seed on every rank (derived from seed)
        strategy wraps the module (DDP, FSDP units from module.block_classes() ...)
        seed_everything(per-rank seed)        # dropout, augmentation: a stream per rank from here on
        loggers (rank 0), the hyperparameters logged
    build_fit (trainer/loop/fit_build.py):
        the global-batch plan and limits (trainer.estimated_stepping_batches known from here)
        optimizer, schedulers = module.configure_optimizers()     # the shapes: see configure_optimizers
        restore a checkpoint (ckpt_path= or trainer.resume): module.on_load_checkpoint(checkpoint),
            datamodule.load_state_dict, callbacks' on_load_checkpoint and load_state_dict
        the batch-size finder (trainer.auto_batch_size); the training step
    fit (trainer/loop/rank_run.py):
        on_fit_start
        sanity check (trainer.num_sanity_val_steps batches): on_sanity_check_start, the validation
            hooks below (nothing logged, RNG kept), on_sanity_check_end
        on_train_start
        for epoch in epochs:
            on_train_epoch_start
            for step in global batches of the epoch:      # one optimizer step each
                for micro_batch in the step's K micro-batches:   # gradient sync only on the last
                    on_before_batch_transfer / transfer_batch_to_device / on_after_batch_transfer
                    on_train_batch_start(micro_batch, index)
                    (last micro-batch: module.optimizer_step(epoch, index, optimizer, closure) -> optimizer.step(closure),
                     the closure running the lines below up to the clipping)
                    out = module.training_step(micro_batch, index)   # loss or {"loss": ..., **metrics}
                    first micro-batch: on_before_zero_grad(optimizer); module.optimizer_zero_grad(...)
                    on_before_backward(loss); module.backward(loss scaled to the global batch); on_after_backward
                    last micro-batch: on_before_optimizer_step(optimizer) (unclipped gradients);
                        module.configure_gradient_clipping(...) (gradient_clip_val); the optimizer step;
                        interval="step" schedulers (module.lr_scheduler_step)
                    on_train_batch_end(out, micro_batch, index)
                # (automatic_optimization = False: training_step alone, once per step, steps the
                #  optimizers itself; manual_backward calls the backward hooks, opt.step() on_before_optimizer_step)
                after_step:
                on logging steps: the metrics logged; ReduceLROnPlateau schedulers monitoring "train/..." metrics
                on_train_step_end(step, metrics_or_None)     # ours: the reduced metrics on logging steps
                on logging steps: trainer.should_stop agreed by every rank
                every val_every_n_steps:
                    module.on_validation_model_zero_grad(); module.on_validation_model_eval()
                    on_validation_start; on_validation_epoch_start
                    per batch: transfer hooks, on_validation_batch_start, module.validation_step(batch, index)
                        (limit_val_batches), on_validation_batch_end(out, batch, index)
                    on_validation_epoch_end; the metrics reduced; ReduceLROnPlateau schedulers on "val/..."
                    on_validation_end(metrics); module.on_validation_model_train() (default: modes put back)
                checkpoint if due (on rank 0: callbacks' state_dict and on_save_checkpoint, the module's)
                a preemption signal: checkpoint and stop
                stop here, on every rank, if a callback called run.request_stop(reason)
            end_epoch:                        # finished epochs only: not after a stop or max_steps
                                              # mid-epoch (a resume goes on inside it)
                validation every check_val_every_n_epoch epochs (the hooks above)
                on_train_epoch_end: callbacks, module (epoch), [self.log's on_epoch values logged],
                    then the callbacks that watch metrics (EarlyStopping)
                interval="epoch" schedulers (every frequency finished epochs)
                checkpoint if due after the epoch
        end_fit:
            final validation (unless the last step validated); save_last checkpoint
            on_train_end; on_fit_end
        teardown(stage): datamodule, callbacks, module       # (an error instead: callbacks' and the
                                                             #  datamodule's on_exception, then raised)
    launcher process (spawned workers): the trained full weights are loaded into the caller's module
        (configure_model() first if it builds layers), unless trainer.return_weights=false; the
        Trainer stores the call's result (global_step, metrics, the resolved batch size ...)

``Trainer.validate`` / ``test`` / ``predict`` run the same set-up (``setup(stage)``) without the optimizer,
then one pass of ``validation_step`` / ``test_step`` / ``predict_step`` over the set with their
hooks (``on_test_model_eval``, ``on_test_start``, ``on_test_epoch_start``, ``on_test_batch_start`` /
``end``, ``on_test_epoch_end``, ``on_test_end``, ``on_test_model_train``; the same for predict), then
``teardown(stage)`` (``trainer/loop/evaluation.py``). With ``datamodule=``
(``trainer/api/datamodule.py``), its data hooks replace the module's per stage.

A user's module never calls ``torch.distributed``: the trainer spreads the data, reduces the
metrics and syncs the gradients.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn
from torch.utils.data import default_collate

from trainer.api.hparams import HyperparametersMixin
from trainer.api.run_state import ModuleRunState
from trainer.api.manual_optimization import ManualOptimizationHooks
from trainer.api.log_methods import ModuleLogMethods
from trainer.api.lightning_hooks import LIGHTNING_HOOKS, refuse_unknown_hooks  # noqa: F401  (their old import path)

if TYPE_CHECKING:
    from torch.utils.data import DataLoader, Dataset

    from trainer.trainer import Trainer

OptimizerFactory = Callable[..., torch.optim.Optimizer]
SchedulerFactory = Callable[..., Any]


class TrainModule(HyperparametersMixin, ModuleRunState, ManualOptimizationHooks, ModuleLogMethods, nn.Module):
    """Base class for what is trained: a model plus its steps, optimizer and data.

    ``self.automatic_optimization = False`` (in ``__init__``): ``training_step`` steps the optimizers
    itself with ``self.optimizers()``, ``self.manual_backward(loss)``, ``self.clip_gradients(...)``,
    ``self.lr_schedulers()`` and ``self.no_backward_sync()`` (Lightning's manual optimization; see
    trainer/loop/manual_step.py). ``self.log`` / ``self.log_dict``: trainer/api/log_methods.py.

    Args:
        optimizer: a factory ``params -> Optimizer`` (e.g. ``functools.partial(torch.optim.AdamW, lr=3e-4)``;
            Hydra builds one from the ``optimizer`` group with ``_partial_: true``). Used by the
            default ``configure_optimizers``.
        scheduler: a factory ``optimizer -> LRScheduler``, stepped once per optimizer step (for other
            intervals, override ``configure_optimizers``).

    Run state (Lightning's names; ``trainer/api/run_state.py``): ``self.device``, ``self.global_step``
    (optimizer steps), ``self.current_epoch``, ``self.global_rank``, ``self.local_rank``,
    ``self.world_size``, ``self.trainer``; ``self.hparams`` after ``save_hyperparameters()``.
    """

    def __init__(self, optimizer: OptimizerFactory | None = None, scheduler: SchedulerFactory | None = None):
        super().__init__()
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self._trainer: Trainer | None = None

    @property
    def trainer(self) -> Trainer:
        """The trainer running this module (set by ``Trainer.fit``)."""
        if self._trainer is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a Trainer yet; call Trainer.fit(module)")
        return self._trainer

    # ----- hyperparameters: save_hyperparameters(), hparams, hparams_initial (trainer/api/hparams.py) --------
    @classmethod
    def load_from_checkpoint(cls, path: str | None = None, map_location: Any = None, strict: bool = True,
                             weights_only: bool | None = None, **overrides: Any) -> Any:
        """A module built from the hyperparameters saved with checkpoint ``path`` (``overrides``
        win), holding its weights. ``path`` (or Lightning's ``checkpoint_path=``): a full-format file, a checkpoint directory (full or
        sharded, of any strategy) or a directory of checkpoints (the latest committed one); read in
        this process, without torch.distributed. Hyperparameters that are objects (an ``nn.Module``,
        a ``functools.partial`` optimizer, a class) are unpickled from the checkpoint's ``hparams.pt``
        (only trust checkpoints you made: unpickling runs code), unless ``weights_only=True``: then
        they must be passed. A hyperparameter redacted as a secret must be passed again, as must the
        required ``__init__`` arguments of a module saved without hyperparameters (an error names
        them). ``strict``: the weights must match the module's names exactly. ``map_location``: where
        the tensors go (as ``torch.load``'s; a device also moves the module)."""
        from trainer.checkpoint.load_module import load_from_checkpoint

        return load_from_checkpoint(cls, path, map_location=map_location, strict=strict, weights_only=weights_only,
                                    **overrides)

    def __getstate__(self) -> dict:
        # Pickled for data-loader workers (a bound collate_fn): without the trainer, whose process
        # groups (pipeline stages, strategy) cannot be pickled; a worker only loads data.
        state = super().__getstate__()
        state["_trainer"] = None
        state["_log_collector"] = None
        state.pop("_manual_step", None)  # holds the run's optimizers and process groups
        state.pop("_gradient_clipper", None)  # (the same, under automatic optimization)
        state.pop("_device_mesh", None)  # strategy=nd's mesh (its process groups)
        state.pop("_fsdp_root_and_group", None)  # an FSDP run's wrapper and process group (trainer/strategies/fsdp.py)
        return state

    # ----- model -------------------------------------------------------------------------------
    def configure_model(self) -> None:
        """Build the layers here when they should be created on each rank rather than in ``__init__``
        (the launcher process then never holds the weights). Runs after seeding, so every rank
        builds identical initial weights."""

    def block_classes(self) -> tuple[type[nn.Module], ...]:
        """The classes of the model's repeated blocks (e.g. the transformer block). FSDP makes
        each block its own sharding unit (``strategy.wrap=auto``); () lets the strategy guess."""
        return ()

    # ----- tensor parallel (strategy=nd with strategy.tp > 1) ----------------------------------------
    def tensor_parallel_plan(self) -> dict[str, Any] | None:
        """How tensor parallelism splits the model: ``{submodule name: ParallelStyle}`` with names
        relative to this module and ``*`` for any one name segment, e.g. ``{"model.blocks.*.mlp.up":
        ColwiseParallel(), "model.blocks.*.mlp.down": RowwiseParallel()}`` (styles from
        ``torch.distributed.tensor.parallel``). The strategy applies it over the mesh's ``tp``
        dimension before activation checkpointing, compile and FSDP (torchtitan's order); a name
        that matches no submodule is refused. None (the default): no plan; a ``configure_model``
        that applies its own (with ``self.device_mesh``, Lightning's way) is used as it is."""
        return None

    def check_tensor_parallel(self, tp: int) -> None:
        """Raise ValueError when the model cannot be split over ``tp`` tensor-parallel ranks (e.g.
        more ranks than attention heads). Called before any worker starts, without building the
        model; the default accepts any degree."""

    @property
    def device_mesh(self) -> Any:
        """The run's DeviceMesh under strategy=nd (dimensions ``pp``, ``dp_replicate``, ``dp_shard``,
        ``cp``, ``tp`` and the flattened ``dp``), set before ``configure_model``; None under the other
        strategies and outside a run."""
        return self.__dict__.get("_device_mesh")

    # ----- pipeline parallel (strategy=pipeline) ---------------------------------------------------
    def pipeline_layers(self) -> list[nn.Module] | None:
        """The model as an ordered list of layers for pipeline parallelism (like DeepSpeed's
        LayerSpec list): ``layers[0]`` takes ``pipeline_input(batch)``, each next layer takes the
        previous one's output (one tensor), the last one's output goes to ``pipeline_loss``. The
        layers must be this module's own submodules (or thin wrappers holding them), so that
        parameter names stay those of the whole model. None (the default): no pipeline."""
        return None

    def pipeline_input(self, batch: Any) -> torch.Tensor:
        """What the first pipeline layer takes from a batch (default: its first element)."""
        return batch[0] if isinstance(batch, (list, tuple)) else batch

    def pipeline_loss(self, output: torch.Tensor, batch: Any) -> torch.Tensor | dict[str, torch.Tensor]:
        """The loss (mean over the micro-batch) from the last layer's ``output`` and the matching
        slice of the batch, or a dict with "loss" and more metrics, as ``training_step`` returns.
        Runs on the last pipeline stage; under strategy=pipeline it replaces ``training_step``
        and ``validation_step`` (during validation the module is in eval mode: ``self.training``
        is False, so validation-only metrics can be returned then)."""
        raise NotImplementedError(f"{type(self).__name__} must implement pipeline_loss() for strategy=pipeline")

    def init_weights(self, module: nn.Module) -> None:
        """Initialise the parameters and buffers that ``module`` (a submodule of this model, or
        the model itself) holds directly. Called for every submodule in ``modules()`` order:
        only on models built on the meta device (``strategy.meta_init=true``), unless you override
        it; an override owns initialisation and runs on every build, eager or meta, seeded
        the same, so both give identical weights. Default: ``module.reset_parameters()``."""
        reset = getattr(module, "reset_parameters", None)
        if callable(reset):
            reset()

    # ----- data ----------------------------------------------------------------------------------
    def prepare_data(self) -> None:
        """Download or unpack data. Runs once per node (local rank 0) while the other ranks wait."""

    def train_dataset(self) -> Dataset:
        """The training dataset (called when ``train_dataloader()`` returns None): map-style, or an
        ``IterableDataset`` read as a stream (``data.stream_mode``; see ``trainer/data/streaming/``). The trainer
        builds the loader with a sampler that keeps every global batch the same whatever the world size
        and accumulation split. Like every data hook, it runs under the same seed on every rank, so
        data drawn from the global generators (``torch.randn``, an unseeded ``random_split``) is the
        same on every rank; the training hooks and the validation hooks get different seeds, so a
        split computed in both must pass ``generator=`` (or be computed once, e.g. in ``__init__``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement train_dataset() or train_dataloader()")

    def val_dataset(self) -> Dataset | None:
        """The validation dataset (called when ``val_dataloader()`` returns None; map-style or a stream),
        or None for no validation. Batched by ``data.batch_size``."""
        return None

    def train_dataloader(self) -> DataLoader | None:
        """Optional, instead of ``train_dataset()``: a DataLoader. Taken from it:
        ``dataset``; ``batch_size`` = the per-rank micro-batch and ``drop_last`` (each must equal
        ``data.batch_size`` / ``data.drop_last`` where those are set; unset, the loader's are used);
        the order: ``shuffle=True`` is the trainer's seeded permutation, ``shuffle=False`` dataset
        order, a generator-free ``sampler`` (``WeightedRandomSampler`` ...) gives each epoch's index
        stream, drawn under the trainer's seed (after ``sampler.set_epoch(epoch)`` if it has one) and
        cut into the same global batches on any world size; ``collate_fn`` (an error if this module
        also overrides ``collate_fn()``); ``num_workers`` and ``pin_memory`` (agreeing with ``data.*``
        like the batch size), ``persistent_workers``, ``worker_init_fn`` (runs after the trainer
        seeded the worker), ``prefetch_factor``, ``timeout``, ``multiprocessing_context``,
        ``pin_memory_device``. Nothing else is read from the loader. A sampler that keeps random
        state of its own across epochs (rather than drawing from the global generators or from
        ``set_epoch``) gives another stream after a resume. Refused with an error saying what to change: a
        custom ``batch_sampler``, ``batch_size=None``, a ``generator`` on the loader or its sampler,
        a ``DistributedSampler`` (the trainer shards), ``in_order=False``; with an ``IterableDataset``
        (a stream, ``trainer/data/streaming/``) also ``persistent_workers=True``.
        Where both this and ``train_dataset()`` are defined, this one is used."""
        return None

    def val_dataloader(self) -> DataLoader | None:
        """Optional, instead of ``val_dataset()``: a validation DataLoader. Its dataset is sharded over
        the ranks, every sample exactly once (no padding duplicates); its own ``batch_size`` (not
        ``data.batch_size``), ``collate_fn`` and worker settings are used. A shuffling or custom
        sampler is honoured: the samples validated on are its stream for the current epoch (drawn
        under the trainer's seed), each position once over the ranks. ``drop_last=True`` leaves out
        the short last batch of that order (what one process with this loader leaves out: the same
        samples on any world size). Refused: what ``train_dataloader`` refuses."""
        return None

    def test_dataset(self) -> Dataset | None:
        """The map-style dataset ``Trainer.test`` runs ``test_step`` over (when ``test_dataloader()``
        returns None), batched by ``data.batch_size``; None: no test data."""
        return None

    def test_dataloader(self) -> DataLoader | None:
        """Optional, instead of ``test_dataset()``: a test DataLoader, read as ``val_dataloader()`` is
        (every sample once over the ranks, its own ``batch_size``, ``drop_last=True`` leaving out the
        short last batch); ``shuffle=True`` changes nothing (the metrics are means over the whole set);
        a custom sampler is refused."""
        return None

    def predict_dataset(self) -> Dataset | None:
        """The map-style dataset ``Trainer.predict`` runs ``predict_step`` over, in dataset order."""
        return None

    def predict_dataloader(self) -> DataLoader | None:
        """Optional, instead of ``predict_dataset()``: a DataLoader whose ``batch_size`` forms the
        batches (in dataset order: ``shuffle=True`` or a sampler is refused)."""
        return None

    def collate_fn(self, samples: list) -> Any:
        """Turn a list of samples into a batch (default: torch's default_collate)."""
        return default_collate(samples)

    # ----- steps ---------------------------------------------------------------------------------
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | dict[str, torch.Tensor]:
        """Return the mean loss of this micro-batch, or a dict with "loss" and more metrics
        (means over the micro-batch). With ``loss_normalization="tokens"`` also return
        "num_tokens", the count the loss is averaged over."""
        raise NotImplementedError(f"{type(self).__name__} must implement training_step()")

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor | dict[str, torch.Tensor] | None:
        """Return the loss or a dict of metrics (means over the batch); the trainer weights them by
        batch size and reduces them across ranks into exact means over the validation set."""
        return None

    def test_step(self, batch: Any, batch_idx: int) -> torch.Tensor | dict[str, torch.Tensor] | None:
        """``Trainer.test``'s step: return the loss or a dict of metrics (means over the batch), reduced
        like validation's into exact means over the test set, logged as ``test/<name>``. ``batch_idx``
        is the batch's index in the whole set (the same on any world size)."""
        raise NotImplementedError(f"{type(self).__name__} must implement test_step() for Trainer.test")

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        """``Trainer.predict``'s step: what to return for one batch (default: ``self(batch)``).
        Tensors in it are moved to the CPU and gathered to rank 0."""
        return self(batch)
    # ----- optimisation ----------------------------------------------------------------------------
    def configure_optimizers(self) -> Any:
        """The optimizer and its learning-rate schedulers. Return one of (Lightning's single-optimizer shapes):

        - ``optimizer``
        - ``(optimizer, scheduler)`` (``scheduler`` None: no scheduler)
        - ``[optimizer]``
        - ``([optimizer], [scheduler, ...])``
        - ``{"optimizer": optimizer, "lr_scheduler": scheduler, "monitor": "val/loss"}`` (``lr_scheduler``
          and ``monitor`` optional; ``monitor`` is for a bare ``ReduceLROnPlateau``), or ``[that dict]``

        where ``optimizer`` is a ``torch.optim.Optimizer`` and each ``scheduler`` is a torch
        ``LRScheduler`` / ``ReduceLROnPlateau`` built on it, or a dict (every key but "scheduler" optional)::

            {"scheduler": scheduler,
             "interval": "step",      # or "epoch": step after every `frequency` optimizer steps / finished epochs
                                      # (an epoch cut short by max_steps or a stop is none); default "step"
                                      # (Lightning's is "epoch"); not used by ReduceLROnPlateau (one warning)
             "frequency": 1,          # an integer >= 1
             "monitor": "val/loss",   # ReduceLROnPlateau only (and required): a "val/..." metric steps it at
                                      # validation ends, a "train/..." metric at logging steps, a self.log
                                      # name where it is reduced; `frequency` counts those events. A monitor
                                      # missing there is an error ...
             "strict": True,          # ... or, with False, that event is skipped (one warning); ReduceLROnPlateau only
             "name": None,            # LearningRateMonitor logs "{name}/group{i}" instead of "lr/group{i}"
             "reduce_on_plateau": ...}  # True exactly for ReduceLROnPlateau (the default says so)

        A step skipped for an fp16 gradient overflow does not step or count for the schedulers.
        Several optimizers (a list of them, ``([opt, ...], [sched, ...])`` or a list of optimizer
        dicts) need ``self.automatic_optimization = False``; the module then steps the schedulers
        itself. Anything else is an error naming what was given. The default uses the factories
        given to ``__init__`` (the Hydra ``optimizer`` and ``scheduler`` groups); an override that is given a factory and never uses it
        (``self.optimizer_factory``) is an error, since the group's settings would be ignored."""
        if self.optimizer_factory is None:
            raise ValueError(
                f"{type(self).__name__} has no optimizer: pass optimizer=... to TrainModule.__init__ "
                "or override configure_optimizers()"
            )
        optimizer = self.optimizer_factory(self.parameters())
        if self.scheduler_factory is None:
            return optimizer
        return optimizer, self.scheduler_factory(optimizer)

    # ----- set-up and tear-down hooks ----------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """At the start of every call on every rank, after ``prepare_data`` and the datamodule's
        ``setup`` and before ``configure_model``: ``stage`` is "fit", "validate", "test" or "predict".
        Runs under the trainer's seed, so layers built here are the same on every rank."""

    def teardown(self, stage: str) -> None:
        """At the end of every call that finished without an error, on every rank."""

    def configure_callbacks(self) -> Any:
        """Callbacks this module brings (a Callback or a list): added to ``Trainer(callbacks=...)`` at
        the start of each call; one of the same class as a Trainer callback replaces it."""
        return []

    # ----- notification hooks (no-ops unless overridden; order: trainer/api/hook_table.py) ----------
    def on_fit_start(self) -> None:
        """After the model is wrapped and the optimizer built, before the sanity check and the first step."""

    def on_fit_end(self) -> None:
        """After training stops, on every rank."""

    def on_train_start(self) -> None:
        """After the sanity check, before the first training epoch."""

    def on_train_end(self) -> None:
        """After the last training step, the final validation and the last save; before ``on_fit_end``."""

    def on_train_epoch_start(self) -> None:
        """Before the first step of an epoch."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> Any:
        """Before each micro-batch's forward (per micro-batch, as Lightning; ``batch_idx`` counts them
        in the epoch). Lightning's ``return -1`` (skip the rest of the epoch) is refused with an error."""

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """After each micro-batch's backward (the last one's: after the optimizer step, as Lightning);
        ``outputs`` is what ``training_step`` returned (device tensors)."""

    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        """Before the gradients are zeroed: after the first micro-batch's forward of each step (Lightning's place)."""

    def on_before_backward(self, loss: torch.Tensor) -> None:
        """Before each backward; ``loss`` is what ``training_step`` returned (unscaled)."""

    def on_after_backward(self) -> None:
        """After each backward (gradients of a non-final micro-batch are not synced yet)."""

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """The step's gradients are synced and unscaled (fp16), not clipped yet (as Lightning);
        the optimizer has not stepped. Not called on an fp16 step skipped for an overflow where the
        host knows it (optimizers that cannot skip on a device flag; logging steps otherwise); on
        other steps a fused optimizer skips on the device after this hook ran, since knowing
        earlier would cost a host sync every step."""

    def on_train_step_end(self, step: int, metrics: dict[str, float] | None) -> None:
        """After optimizer step ``step`` (1-based). ``metrics`` holds the reduced metrics on logging
        steps and None otherwise (no host sync on the other steps)."""

    def on_train_epoch_end(self, epoch: int) -> None:
        """After the last step of an epoch (only of an epoch that finished: a run that stops at
        ``max_steps`` mid-epoch does not end that epoch). Lightning's shape ``on_train_epoch_end(self)``
        works too."""

    def on_validation_model_zero_grad(self) -> None:
        """Before a validation pass inside ``fit``: frees the gradients (Lightning's default)."""
        self.zero_grad(set_to_none=True)

    def on_validation_model_eval(self) -> None:
        """Puts the module in eval mode before a validation pass."""
        self.eval()

    def on_validation_model_train(self) -> None:
        """After a validation pass; by default the trainer puts back each submodule's mode as it was
        before (an override takes that over)."""

    def on_test_model_eval(self) -> None:
        """Puts the module in eval mode before ``Trainer.test``'s pass."""
        self.eval()

    def on_test_model_train(self) -> None:
        """After the test pass; by default each submodule's mode is put back."""

    def on_predict_model_eval(self) -> None:
        """Puts the module in eval mode before ``Trainer.predict``'s pass."""
        self.eval()

    def on_validation_start(self) -> None:
        """Before a validation pass (also the sanity pass), after ``on_validation_model_eval``."""

    def on_validation_end(self, metrics: dict[str, float]) -> None:
        """After a validation pass, with the metrics reduced over all ranks (after the sanity pass: its
        metrics, which are not logged). Lightning's shape ``on_validation_end(self)`` works too."""

    def on_validation_epoch_start(self) -> None:
        """Before the first batch of a validation pass."""

    def on_validation_epoch_end(self) -> None:
        """After the last batch of a validation pass, before its metrics are reduced (what it logs belongs to the pass)."""

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Before each validation batch of this rank."""

    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """After each validation batch of this rank; ``outputs`` is what ``validation_step`` returned."""

    def on_test_start(self) -> None:
        """Before ``Trainer.test``'s pass."""

    def on_test_end(self) -> None:
        """After ``Trainer.test``'s pass and its metrics."""

    def on_test_epoch_start(self) -> None:
        """Before the first test batch."""

    def on_test_epoch_end(self) -> None:
        """After the last test batch, before the metrics are reduced."""

    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Before each test batch of this rank."""

    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """After each test batch of this rank."""

    def on_predict_start(self) -> None:
        """Before ``Trainer.predict``'s pass."""

    def on_predict_end(self) -> None:
        """After ``Trainer.predict``'s pass."""

    def on_predict_epoch_start(self) -> None:
        """Before the first predict batch."""

    def on_predict_epoch_end(self) -> None:
        """After the last predict batch."""

    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """Before each predict batch of this rank."""

    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        """After each predict batch of this rank; ``outputs`` is what ``predict_step`` returned."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """While a checkpoint is saved (rank 0, after the callbacks' hooks): ``checkpoint`` holds
        ``step`` and ``epoch`` (not the weights: they are written in the strategy's format); keys
        added are saved and given back to ``on_load_checkpoint``."""

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """On resume, on every rank, before the callbacks' hooks: the dict ``on_save_checkpoint`` filled."""

    # ----- hooks that replace what the trainer does (defaults: what it does) -------------------------
    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """The backward of ``loss`` (already weighted for the global batch and scaled for fp16)."""
        loss.backward(*args, **kwargs)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        """Step ``optimizer``: ``optimizer_closure`` runs the last micro-batch's ``training_step`` and
        backward, ``on_before_optimizer_step`` and the clipping; it must be called (by
        ``optimizer.step(closure=optimizer_closure)``, or before a custom step)."""
        optimizer.step(closure=optimizer_closure)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: torch.optim.Optimizer) -> None:
        """Zero the gradients (after the first micro-batch's forward of a step, as Lightning)."""
        optimizer.zero_grad()

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Clip before the step (``Trainer(gradient_clip_val=...)``'s values); default: ``self.clip_gradients``."""
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm or "norm")

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        """Step one scheduler (``metric``: the monitored value of a ReduceLROnPlateau, else None)."""
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """A batch as loaded, before it moves to the device; return the batch to use."""
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move a batch to ``device`` (tensors in nested lists, tuples and dicts)."""
        from trainer.runtime.tensors import move_to_device

        return move_to_device(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """A batch on the device; return the batch to use."""
        return batch
