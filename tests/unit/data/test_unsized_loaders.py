"""A loader that is not a DataLoader (an iterable of batches) is refused with one line naming it; a
fraction limit of one without a length gets Lightning's error (a MisconfigurationException) first."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer.api.errors import MisconfigurationException
from trainer.data.loader_reading import read_loader


class Batches:
    """An iterable of batches without a length."""

    def __init__(self):
        self.loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)

    def __iter__(self):
        return iter(self.loader)

    def __len__(self):
        raise NotImplementedError


@pytest.mark.parametrize("limit", [0.5, 0.25])
def test_a_fraction_of_a_loader_without_length_is_lightnings_error(limit):
    with pytest.raises(MisconfigurationException, match=r"val_dataloader\(\) returned Batches, which has no length "
                                                        r"\(as an `IterableDataset`\): `Trainer\(limit_val_batches\)` "
                                                        r"must be `1.0` or an int"):
        read_loader(Batches(), "val_dataloader()", limit=("limit_val_batches", limit))


@pytest.mark.parametrize("limit", [None, 1.0, 3])
def test_otherwise_a_loader_of_another_kind_is_refused(limit):
    with pytest.raises(TypeError, match=r"val_dataloader\(\) must return a torch.utils.data.DataLoader \(or None\), "
                                        "got Batches"):
        read_loader(Batches(), "val_dataloader()", limit=("limit_val_batches", limit))
