"""Lightning's ``lightning.fabric``: ``Fabric`` for one process on one device in full precision
(``fabric.py``) and the utilities Lightning programs import from it (``utilities/``)."""

from trainer.lightning._missing import missing_names
from trainer.lightning.fabric.fabric import Fabric

__all__ = ["Fabric"]

__getattr__ = missing_names(__name__, {"seed_everything": "trainer.lightning.seed_everything"})
