"""TrainModule: the hooks a user overrides.

The whole loop, with every hook where it fires (``Trainer.fit``)::

    launcher process:  Trainer(...) validates the config; module.__init__ ran already
    every rank:
        seed_everything(seed)
        module.prepare_data()                 # local rank 0 of each node only; the others wait
        module.configure_model()              # build layers here (or in __init__); on the meta device
                                              # with strategy.meta_init=true
        module.init_weights(submodule)        # per submodule, if overridden (or on a meta build)
        strategy wraps the module (DDP, FSDP units from module.block_classes() ...)
        optimizer[, scheduler] = module.configure_optimizers()
        restore a checkpoint (ckpt_path= or trainer.resume), callbacks' state included
        module.on_fit_start();                callback.on_fit_start(run) for each callback
        for epoch in epochs:
            for step in global batches of the epoch:      # one optimizer step each
                for micro_batch in the step's K micro-batches:   # gradient sync only on the last
                    out = module.training_step(micro_batch, index)   # loss or {"loss": ..., **metrics}
                    backward(loss scaled to the global batch)
                clip gradients (gradient_clip_val); module.on_before_optimizer_step(optimizer)
                optimizer.step(); scheduler.step(); optimizer.zero_grad()
                module.on_train_step_end(step, metrics_or_None);  callback.on_train_step_end(run, step, metrics_or_None)
                every val_every_n_steps:
                    module.validation_step(batch, index) over the val set
                    module.on_validation_end(metrics);  callback.on_validation_end(run, metrics)
                checkpoint if due
                stop here, on every rank, if a callback called run.request_stop(reason)
            module.on_train_epoch_end(epoch);     callback.on_train_epoch_end(run, epoch)   # finished epochs only:
                                              # not after a stop or max_steps mid-epoch (a resume goes on inside it)
        final validation (unless the last step validated); save_last checkpoint
        module.on_fit_end();                  callback.on_fit_end(run)
    launcher process (spawned workers): the trained full weights are loaded into the caller's module
        (configure_model() first if it builds layers), unless trainer.return_weights=false

Callbacks (``Trainer(callbacks=[...])``, see ``trainer/callbacks/base.py``) run after the module's
hook of the same name, in the order given.

A user's module never calls ``torch.distributed``: the trainer spreads the data, reduces the
metrics and syncs the gradients.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.utils.data import DataLoader, Dataset

    from trainer.trainer import Trainer

OptimizerFactory = Callable[..., torch.optim.Optimizer]
SchedulerFactory = Callable[..., Any]


class TrainModule(nn.Module):
    """Base class for what is trained: a model plus its steps, optimizer and data.

    Args:
        optimizer: a factory ``params -> Optimizer`` (e.g. ``functools.partial(torch.optim.AdamW, lr=3e-4)``;
            Hydra builds one from the ``optimizer`` group with ``_partial_: true``). Used by the
            default ``configure_optimizers``.
        scheduler: a factory ``optimizer -> LRScheduler``, stepped once per optimizer step.
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

    # ----- model -------------------------------------------------------------------------------
    def configure_model(self) -> None:
        """Build the layers here when they should be created on each rank rather than in ``__init__``
        (the launcher process then never holds the weights). Runs after seeding, so every rank
        builds identical initial weights."""

    def block_classes(self) -> tuple[type[nn.Module], ...]:
        """The classes of the model's repeated blocks (e.g. the transformer block). FSDP makes
        each block its own sharding unit (``strategy.wrap=auto``); () lets the strategy guess."""
        return ()

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
        """The map-style training dataset. The trainer builds the loader with a sampler that keeps
        every global batch the same whatever the world size and accumulation split."""
        raise NotImplementedError(f"{type(self).__name__} must implement train_dataset() or train_dataloader()")

    def val_dataset(self) -> Dataset | None:
        """The map-style validation dataset, or None for no validation."""
        return None

    def train_dataloader(self) -> DataLoader | None:
        """Optional: a DataLoader whose dataset, collate_fn and worker settings the trainer reuses;
        its sampler is replaced by the trainer's global-batch sampler."""
        return None

    def collate_fn(self, samples: list) -> Any:
        """Turn a list of samples into a batch (default: torch's default_collate)."""
        from torch.utils.data import default_collate

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

    # ----- optimisation ----------------------------------------------------------------------------
    def configure_optimizers(self) -> Any:
        """Return an optimizer, a tuple ``(optimizer, scheduler)`` or a dict
        ``{"optimizer": ..., "lr_scheduler": ...}``. The default uses the factories given to
        ``__init__`` (the Hydra ``optimizer`` and ``scheduler`` groups)."""
        if self.optimizer_factory is None:
            raise ValueError(
                f"{type(self).__name__} has no optimizer: pass optimizer=... to TrainModule.__init__ "
                "or override configure_optimizers()"
            )
        optimizer = self.optimizer_factory(self.parameters())
        if self.scheduler_factory is None:
            return optimizer
        return optimizer, self.scheduler_factory(optimizer)

    # ----- notification hooks (no-ops unless overridden) ------------------------------------------
    def on_fit_start(self) -> None:
        """After the model is wrapped and the optimizer built, before the first step."""

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Gradients are synced, scaled and clipped; the optimizer has not stepped yet."""

    def on_train_step_end(self, step: int, metrics: dict[str, float] | None) -> None:
        """After optimizer step ``step`` (1-based). ``metrics`` holds the reduced metrics on logging
        steps and None otherwise (no host sync on the other steps)."""

    def on_validation_end(self, metrics: dict[str, float]) -> None:
        """After a validation pass, with the metrics reduced over all ranks."""

    def on_train_epoch_end(self, epoch: int) -> None:
        """After the last step of an epoch (only of an epoch that finished: a run that stops at
        ``max_steps`` mid-epoch does not end that epoch)."""

    def on_fit_end(self) -> None:
        """After training stops, on every rank."""
