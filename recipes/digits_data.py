"""scikit-learn's 8x8 digits as a :class:`~trainer.DataModule`: ``python train.py recipe=cnn datamodule=digits``.

The data of a run kept apart from its model: the same split (train / validation / test, fixed by
``data_seed``) for any module that takes ``(1, 8, 8)`` images (``flatten=true``: 64 features).
"""

from __future__ import annotations

from torch.utils.data import TensorDataset

from trainer.recipes.cnn import digits_split
from trainer import DataModule


class DigitsDataModule(DataModule):
    """Train / validation / test splits of the 1,797 digits; ``test_fraction`` of the images
    ``digits_split`` trains on is held out for ``Trainer.test`` (and ``predict``)."""

    def __init__(self, val_fraction: float = 0.2, test_fraction: float = 0.1, data_seed: int = 1234,
                 flatten: bool = False):
        for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
            if not 0 < value < 1:
                raise ValueError(f"datamodule.{name} must be between 0 and 1 (exclusive), got {value}")
        self.val_fraction, self.test_fraction, self.data_seed, self.flatten = val_fraction, test_fraction, data_seed, flatten
        self.splits: dict[str, TensorDataset] = {}

    def prepare_data(self) -> None:
        from sklearn.datasets import load_digits

        load_digits()  # ships with scikit-learn: nothing to download, but this is where a download goes

    def setup(self, stage: str) -> None:
        train, val = digits_split(self.data_seed, self.val_fraction)
        num_test = int(round(len(train) * self.test_fraction))
        images, labels = train.tensors
        if self.flatten:
            images, val = images.flatten(1), TensorDataset(val.tensors[0].flatten(1), val.tensors[1])
        self.splits = {"train": TensorDataset(images[num_test:], labels[num_test:]), "val": val,
                       "test": TensorDataset(images[:num_test], labels[:num_test])}

    def train_dataset(self) -> TensorDataset:
        return self.splits["train"]

    def val_dataset(self) -> TensorDataset:
        return self.splits["val"]

    def test_dataset(self) -> TensorDataset:
        return self.splits["test"]

    def predict_dataset(self) -> TensorDataset:
        return TensorDataset(self.splits["test"].tensors[0])  # images only: predict_step gets (images,)

