"""Lightning's ``lightning.pytorch.utilities.model_helpers``: ``is_overridden`` (does a module, DataModule
or callback define its own ``method_name``: an override in its class, or a callable set on the
instance, as opposed to the base class's? An attribute set to None, Lightning's way to turn a hook
off with ``module.validation_step = None``, is not an override; a wrapper around the base's method
is none either) and ``get_torchvision_model``."""

from __future__ import annotations

from typing import Any

from trainer.api.lightning_hooks import defines_own


def is_overridden(method_name: str, instance: Any = None, parent: type | None = None) -> bool:
    """Whether ``instance.<method_name>`` is not ``parent``'s (by default the LightningModule,
    LightningDataModule or Callback base the instance derives from); False for no instance. A
    wrapper set on the instance (``functools.wraps``, ``Mock(wraps=...)``, ``functools.partial``)
    stands for the function it wraps."""
    if instance is None:
        return False
    return defines_own(instance, _base_of(instance) if parent is None else parent, method_name)


def _base_of(instance: Any) -> type:
    from trainer.api.callback import Callback
    from trainer.api.datamodule import DataModule
    from trainer.api.module import TrainModule

    for base in (TrainModule, DataModule, Callback):
        if isinstance(instance, base):
            return base
    raise ValueError(f"is_overridden: give parent= for a {type(instance).__name__} (not a LightningModule, "
                     "LightningDataModule or Callback)")


def get_torchvision_model(model_name: str, **kwargs: Any) -> Any:
    """torchvision's model ``model_name`` (``"resnet18"``) built with ``kwargs`` (``weights=None`` ...):
    ``torchvision.models.get_model``. torchvision is the program's own dependency, imported here."""
    try:
        from torchvision import models
    except ImportError as error:
        raise ModuleNotFoundError(f"get_torchvision_model({model_name!r}) needs torchvision: pip install torchvision "
                                  f"({error})") from error
    return models.get_model(model_name, **kwargs)
