"""DataModule: the data of a run kept apart from the model (Lightning's ``LightningDataModule``).

Passed as ``datamodule=`` to ``Trainer.fit`` / ``validate`` / ``test`` / ``predict`` (or selected
from Hydra: ``python train.py recipe=mlp datamodule=digits``). Which object's data hooks a run
calls is decided per stage (train, val, test, predict): where the datamodule defines that stage's
``<stage>_dataset()`` or ``<stage>_dataloader()``, both come from the datamodule (Lightning's rule:
the datamodule wins) and the module's hooks of that stage are not called (one warning names
them); otherwise the module's are used.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from trainer.api.hook_calls import call_with_stage
from trainer.api.hparams import HyperparametersMixin
from trainer.runtime.seeding import derive_seed, seeded
from trainer.runtime.rank_logging import rank_zero_warn

if TYPE_CHECKING:
    from torch.utils.data import DataLoader, Dataset

log = logging.getLogger(__name__)

#: The stage a call runs, as ``DataModule.setup(stage)`` receives it, per entry point.
STAGES = ("fit", "validate", "test", "predict")
#: The data hooks of each data stage: a dataset hook and a loader hook (the loader one wins when both return data).
STAGE_HOOKS = {
    "train": ("train_dataset", "train_dataloader"),
    "val": ("val_dataset", "val_dataloader"),
    "test": ("test_dataset", "test_dataloader"),
    "predict": ("predict_dataset", "predict_dataloader"),
}


class DataModule(HyperparametersMixin):
    """Base class for a run's data. Override what you have; every hook is optional.

    Every rank calls ``setup(stage)`` and the data hooks under the same seed (derived from
    ``trainer.seed``; ``setup`` gets one seed for every stage), so an unseeded ``random_split`` gives
    the same split on every rank, and in ``fit`` and a later ``test``.
    ``prepare_data()`` runs once per node (local rank 0) before the others go on (download here).
    The dataset / loader hooks mean what the `TrainModule` hooks of the same
    names mean (what a returned DataLoader may hold: ``TrainModule.train_dataloader``).
    ``self.trainer`` is the Trainer of the call it is attached to (e.g. ``self.trainer.world_size`` in
    ``setup``), from the moment ``fit`` / ``validate`` / ``test`` / ``predict`` receives it; None before.
    """

    #: the Trainer whose call this datamodule is attached to (None until then)
    trainer: Any = None

    # save_hyperparameters(), hparams, hparams_initial: trainer/api/hparams.py (saved with every
    # checkpoint of a fit given this datamodule, and sent to the loggers with the module's)
    @classmethod
    def load_from_checkpoint(cls, path: str | None = None, weights_only: bool | None = None, **overrides: Any) -> Any:
        """A datamodule built from the hyperparameters this class saved in checkpoint ``path`` (a
        checkpoint directory, a file in it or a directory of checkpoints), ``overrides`` winning.
        Objects among them are unpickled from the checkpoint's ``hparams.pt`` unless
        ``weights_only=True`` (then they must be passed); a secret must be passed again."""
        from trainer.checkpoint.load_module import load_datamodule_from_checkpoint

        return load_datamodule_from_checkpoint(cls, path, weights_only=weights_only, **overrides)

    def prepare_data(self) -> None:
        """Download or unpack data. Runs once per node (local rank 0) while the other ranks wait."""

    def setup(self, stage: str) -> None:
        """Build the datasets ``stage`` needs: "fit", "validate", "test" or "predict" (every rank)."""

    def train_dataset(self) -> Dataset:
        """The map-style training dataset (when ``train_dataloader()`` returns None)."""
        raise NotImplementedError(f"{type(self).__name__} must implement train_dataset() or train_dataloader()")

    def train_dataloader(self) -> DataLoader | None:
        """A training DataLoader instead of ``train_dataset()``."""
        return None

    def val_dataset(self) -> Dataset | None:
        """The validation dataset, or None for no validation."""
        return None

    def val_dataloader(self) -> DataLoader | None:
        """A validation DataLoader instead of ``val_dataset()``."""
        return None

    def test_dataset(self) -> Dataset | None:
        """The test dataset for ``Trainer.test``."""
        return None

    def test_dataloader(self) -> DataLoader | None:
        """A test DataLoader instead of ``test_dataset()``."""
        return None

    def predict_dataset(self) -> Dataset | None:
        """The dataset ``Trainer.predict`` runs ``predict_step`` over, in order."""
        return None

    def predict_dataloader(self) -> DataLoader | None:
        """A predict DataLoader instead of ``predict_dataset()`` (no shuffling or sampler: dataset order)."""
        return None

    def teardown(self, stage: str) -> None:
        """At the end of every call that finished without an error (before the callbacks' and the module's)."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of this datamodule (saved by rank 0; what ``torch.load(weights_only=True)``
        reads: numbers, strings, lists, dicts, tensors)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (on resume, every rank)."""

    def on_exception(self, exception: BaseException) -> None:
        """A call failed with ``exception`` on this rank (it is raised again afterwards)."""

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """A batch as loaded, before it moves to the device (overrides the module's hook of the same name)."""
        return batch

    def transfer_batch_to_device(self, batch: Any, device: Any, dataloader_idx: int) -> Any:
        """Move a batch to ``device`` (overrides the module's hook of the same name)."""
        from trainer.runtime.tensors import move_to_device

        return move_to_device(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """A batch on the device (overrides the module's hook of the same name)."""
        return batch


def _overrides(obj: Any, base: type, name: str) -> bool:
    if _unset(obj, name):
        return False
    own = getattr(obj, "__dict__", {}).get(name)
    if callable(own):  # a hook set on the instance (Lightning's DataModule.from_datasets sets its loaders so)
        return not getattr(own, "missing_stage", False)
    return getattr(type(obj), name, None) is not getattr(base, name, None)


def _unset(obj: Any, name: str) -> bool:
    """Whether the hook ``name`` was set to None on the object (Lightning's way to say "not defined":
    ``model.val_dataloader = None``)."""
    return name in getattr(obj, "__dict__", {}) and obj.__dict__[name] is None


def _hook(owner: Any, name: str, module_base: type) -> Any:
    """The data hook ``name`` of ``owner``; the base class's (no data) where it was set to None
    (``module_base``: the module's base class, TrainModule)."""
    if not _unset(owner, name):
        return getattr(owner, name)
    return getattr(DataModule if isinstance(owner, DataModule) else module_base, name).__get__(owner)


class GivenLoader:
    """A DataLoader passed to the entry point (``train_dataloaders=``, ``dataloaders=`` ...): the data
    hooks of its stage, as if the module's ``<stage>_dataloader()`` returned it."""

    def __init__(self, stage: str, loader: Any):
        self.stage, self.loader = stage, loader
        setattr(self, STAGE_HOOKS[stage][0], lambda: None)
        setattr(self, STAGE_HOOKS[stage][1], lambda: loader)


#: The entry-point argument that gives each stage's loader (in errors about it).
GIVEN_LOADER_ARGUMENT = {"train": "fit(train_dataloaders=)", "val": "val_dataloaders= / dataloaders=",
                         "test": "test(dataloaders=)", "predict": "predict(dataloaders=)"}


class DataHooks:
    """The data hooks a run calls: a loader given to the entry point for its stage, else the
    datamodule's for each stage it defines, else the module's.

    Attributes: ``train_dataset``, ``train_dataloader``, ``val_dataset``, ... (bound methods),
    ``source[stage]``: the object that gives the stage's data (its class name goes in errors), and
    ``where[stage]``: how errors name the stage's loader ("train_dataloader()", "fit(train_dataloaders=)").
    """

    def __init__(self, module: Any, datamodule: DataModule | None, given: dict[str, Any] | None = None):
        from trainer.api.module import TrainModule

        self.source: dict[str, Any] = {}
        self.where: dict[str, str] = {}
        shadowed, replaced = [], []
        for stage, names in STAGE_HOOKS.items():
            owner = module
            self.where[stage] = f"{names[1]}()"
            if given and stage in given:
                owner = GivenLoader(stage, given[stage])
                self.where[stage] = GIVEN_LOADER_ARGUMENT[stage]
                replaced += [f"{type(module).__name__}.{name}()" for name in names if _overrides(module, TrainModule, name)]
            elif datamodule is not None and any(_overrides(datamodule, DataModule, name) for name in names):
                owner = datamodule
                shadowed += [f"{type(module).__name__}.{name}()" for name in names if _overrides(module, TrainModule, name)]
            self.source[stage] = owner
            for name in names:
                setattr(self, name, _hook(owner, name, TrainModule))
        if shadowed:
            rank_zero_warn(log, "%s not called: the datamodule %s gives that data (the datamodule's hooks win)",
                           ", ".join(shadowed), type(datamodule).__name__)
        if replaced:
            rank_zero_warn(log, "%s not called: the DataLoader passed to the entry point gives that data",
                           ", ".join(replaced))


def check_datamodule(datamodule: Any) -> None:
    """A clear error for something passed as ``datamodule=`` that is not a DataModule."""
    if datamodule is None:
        return
    if not isinstance(datamodule, DataModule):
        raise TypeError(f"datamodule= expects a trainer.DataModule (or None), got {type(datamodule).__name__}; "
                        "subclass trainer.DataModule and override its data hooks")


def setup_datamodule(datamodule: DataModule | None, stage: str, seed: int) -> None:
    """``datamodule.setup(stage)`` on this rank, under the seed every rank shares for it. The seed
    is the same for every stage, so an unseeded split made in ``setup`` is the same split for
    ``fit`` and a later ``test``."""
    if datamodule is None:
        return
    if stage not in STAGES:
        raise ValueError(f"DataModule.setup: stage={stage!r} is not one of {STAGES}")
    with seeded(derive_seed(seed, "data", "setup")):
        call_with_stage(datamodule.setup, stage)
