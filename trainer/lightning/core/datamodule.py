"""``LightningDataModule``: this trainer's `DataModule`, the same hooks
(``prepare_data``, ``setup(stage)``, ``*_dataloader``) meaning the same."""

from trainer.api.datamodule import DataModule as LightningDataModule

__all__ = ["LightningDataModule"]
