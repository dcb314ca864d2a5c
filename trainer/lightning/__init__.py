"""Lightning's import paths over this trainer: a Lightning program runs here once its imports say
``trainer.lightning`` where they said ``lightning.pytorch``, ``lightning`` or ``pytorch_lightning``::

    import lightning as L                      ->  import trainer.lightning as L
    from lightning.pytorch.callbacks import X  ->  from trainer.lightning.callbacks import X
    import pytorch_lightning as pl             ->  import trainer.lightning as pl

Every name is this trainer's own implementation of what Lightning's means: ``LightningModule``
(``core/module.py``: a ``TrainModule`` built with Lightning's constructor), ``LightningDataModule``,
``Trainer``, ``Callback``, ``seed_everything`` (``seed.py``), ``callbacks/``, ``loggers/``,
``utilities/`` (with ``types.py``, ``imports.py``, ``rank_zero.py``), ``core/optimizer.py``
(``LightningOptimizer``), ``Fabric`` (``fabric/fabric.py``: one process, one device) and
``fabric/utilities/imports.py``. ``trainer.lightning.pytorch`` is this
module again (``L.pytorch.callbacks...``). A Lightning name this trainer does not have is an
ImportError that says what to use (``_missing.py``), never a stand-in; so is a Lightning module it
does not have (``trainer.lightning.tuner``). Importing it sets ``lightning_utilities``' rank as
importing Lightning does (``utilities/rank_zero.py``).
"""

from trainer.api.callback import Callback
from trainer.lightning import callbacks, core, fabric, loggers, utilities
from trainer.lightning._missing import install_missing_module_finder
from trainer.lightning.core import LightningDataModule, LightningModule
from trainer.lightning.fabric import Fabric
from trainer.lightning.cli import cli_lightning_logo
from trainer.lightning.seed import seed_everything
from trainer.lightning.trainer import Trainer
from trainer.lightning.utilities.rank_zero import share_rank_with_lightning_utilities

install_missing_module_finder()  # a Lightning module this trainer lacks: an ImportError saying what to use
share_rank_with_lightning_utilities()  # as importing Lightning does

__all__ = ["Callback", "Fabric", "LightningDataModule", "LightningModule", "Trainer", "cli_lightning_logo", "seed_everything",
           "callbacks", "core", "fabric", "loggers", "pytorch", "utilities"]

from trainer.lightning import pytorch  # noqa: E402  (after the names it re-exports)
