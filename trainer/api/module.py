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
                    on_train_batch_start(micro_batch, index)   # the module's -1 (any rank): no step, the
                                                               # epoch's rest skipped, end_epoch without validation
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
            end_epoch:                        # finished, stopped or skipped epochs: not after max_steps
                                              # mid-epoch or preemption (a resume goes on inside it)
                validation every check_val_every_n_epoch epochs, or without it after a stop (the hooks above)
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

from trainer.api.data_hooks import DataHooks
from trainer.api.evaluation_hooks import EvaluationHooks
from trainer.api.fit_hooks import FitHooks
from trainer.api.hparams import HyperparametersMixin
from trainer.api.log_methods import ModuleLogMethods
from trainer.api.manual_optimization import ManualOptimizationHooks
from trainer.api.model_hooks import ModelHooks
from trainer.api.optimization_hooks import OptimizationHooks
from trainer.api.run_state import ModuleRunState
from trainer.api.step_hooks import StepHooks

if TYPE_CHECKING:
    from trainer.trainer import Trainer

OptimizerFactory = Callable[..., torch.optim.Optimizer]
SchedulerFactory = Callable[..., Any]


# The hooks by family, each in its own file: model_hooks.py, data_hooks.py, step_hooks.py,
# optimization_hooks.py, fit_hooks.py, evaluation_hooks.py (and manual_optimization.py, log_methods.py).
class TrainModule(HyperparametersMixin, ModuleRunState, ManualOptimizationHooks, ModuleLogMethods, ModelHooks,
                  DataHooks, StepHooks, OptimizationHooks, FitHooks, EvaluationHooks, nn.Module):
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

    ``scheduler_interval`` (class attribute, ``"step"``): how often a scheduler that
    ``configure_optimizers`` returns without an ``interval`` steps; ``LightningModule`` sets
    ``"epoch"``, Lightning's default, so that a ported program's schedule keeps its meaning.

    Run state (Lightning's names; ``trainer/api/run_state.py``): ``self.device``, ``self.global_step``
    (optimizer steps), ``self.current_epoch``, ``self.global_rank``, ``self.local_rank``,
    ``self.world_size``, ``self.trainer``; ``self.hparams`` after ``save_hyperparameters()``.
    """

    scheduler_interval: str = "step"

    def __init__(self, optimizer: OptimizerFactory | None = None, scheduler: SchedulerFactory | None = None):
        super().__init__()
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self._trainer: Trainer | None = None

    @property
    def trainer(self) -> Trainer:
        """The trainer running this module (set by ``Trainer.fit``); None while TensorBoard traces the
        module's graph without one (the tracer reads every attribute)."""
        if self._trainer is None and not self.__dict__.get("_graph_tracing"):
            raise RuntimeError(f"{type(self).__name__} is not attached to a Trainer yet; call Trainer.fit(module)")
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: Trainer | None) -> None:
        """Attach this module to ``trainer`` (None: detach), as Lightning's ``module.trainer = trainer``;
        each call of a Trainer attaches its module itself."""
        self._trainer = trainer

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


#: properties ``torch.jit.script`` leaves alone: this trainer's own (run state read through the trainer,
#: not TorchScript); a subclass's own properties are compiled, as under Lightning
TrainModule.__jit_unused_properties__ = sorted({name for base in TrainModule.__mro__ for name, value in vars(base).items()
                                                if isinstance(value, property)})
