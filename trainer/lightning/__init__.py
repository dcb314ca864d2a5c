"""Lightning's import paths over this trainer: a Lightning program runs here once its imports say
``trainer.lightning`` where they said ``lightning.pytorch``, ``lightning`` or ``pytorch_lightning``::

    import lightning as L                      ->  import trainer.lightning as L
    from lightning.pytorch.callbacks import X  ->  from trainer.lightning.callbacks import X
    import pytorch_lightning as pl             ->  import trainer.lightning as pl

Every name is this trainer's own implementation of what Lightning's means: ``LightningModule``
(``core/module.py``: a ``TrainModule`` built with Lightning's constructor), ``LightningDataModule``,
``Trainer``, ``Callback``, ``seed_everything`` (``seed.py``), ``callbacks/``, ``loggers/``,
``utilities/`` (with ``types.py``, ``imports.py``, ``rank_zero.py``), ``core/optimizer.py``
(``LightningOptimizer``) and ``fabric/utilities/imports.py``. ``trainer.lightning.pytorch`` is this
module again (``L.pytorch.callbacks...``). A Lightning name this trainer does not have is an
ImportError that says what to use (``_missing.py``), never a stand-in.
"""

from trainer.api.callback import Callback
from trainer.lightning import callbacks, core, fabric, loggers, utilities
from trainer.lightning._missing import missing_names
from trainer.lightning.core import LightningDataModule, LightningModule
from trainer.lightning.seed import seed_everything
from trainer.lightning.trainer import Trainer

__all__ = ["Callback", "LightningDataModule", "LightningModule", "Trainer", "seed_everything",
           "callbacks", "core", "fabric", "loggers", "pytorch", "utilities"]

__getattr__ = missing_names(__name__, {
    "Fabric": "trainer.lightning.Trainer with a trainer.lightning.LightningModule (this trainer has no Fabric)",
})

from trainer.lightning import pytorch  # noqa: E402  (after the names it re-exports)
