"""Lightning's ``lightning.fabric``: only the utilities Lightning programs import from it
(``utilities/imports.py``); ``Fabric`` itself is an ImportError saying what to use."""

from trainer.lightning._missing import missing_names

_USE_TRAINER = "trainer.lightning.Trainer with a trainer.lightning.LightningModule (this trainer has no Fabric)"
__getattr__ = missing_names(__name__, {"Fabric": _USE_TRAINER, "seed_everything": "trainer.lightning.seed_everything"})
