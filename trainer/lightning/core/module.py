"""``LightningModule``: this trainer's `TrainModule` with Lightning's constructor.

Lightning's ``LightningModule.__init__(*args, **kwargs)`` hands its arguments to ``nn.Module``,
which takes none; ``TrainModule.__init__`` takes this trainer's optimizer / scheduler factories,
which a Lightning program never passes. So ``super().__init__()`` is what a Lightning program
calls, and anything passed to it is an error (as under Lightning) instead of being read as a factory.

Used with a `trainer.lightning.Fabric` (``fabric.setup(module)`` sets ``module.fabric``; ``fabric_use.py``),
``self.log`` / ``self.log_dict``, ``self.logger`` / ``self.loggers``, ``self.clip_gradients``,
``self.manual_backward`` and ``self.optimizers()`` go through the Fabric, as Lightning's do.
"""

from __future__ import annotations

from typing import Any

from trainer.api.module import TrainModule
from trainer.lightning.core.fabric_use import FabricUse


class LightningModule(FabricUse, TrainModule):
    """A `TrainModule` built as Lightning builds its modules: every
    hook, ``self.log``, ``save_hyperparameters``, ``self.optimizers()`` ... are TrainModule's; a
    scheduler ``configure_optimizers`` returns without an ``interval`` steps once per epoch, as
    under Lightning."""

    scheduler_interval = "epoch"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args or kwargs:
            given = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
            raise TypeError(
                f"LightningModule.__init__() takes no arguments, got {', '.join(given)} (as under Lightning, "
                "where they go to torch.nn.Module); keep them as attributes or save_hyperparameters() of your "
                "subclass, or subclass trainer.TrainModule to pass optimizer= / scheduler= factories"
            )
        super().__init__()


#: (torch.jit.script: this trainer's properties are not compiled; trainer/api/module.py)
LightningModule.__jit_unused_properties__ = sorted({name for base in LightningModule.__mro__
                                                    for name, value in vars(base).items() if isinstance(value, property)})
