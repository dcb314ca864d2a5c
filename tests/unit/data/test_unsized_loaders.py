"""A loader that is not a DataLoader: an iterable of ready batches is read as a stream of batches (one
process; refused on several with one line), anything else is refused with one line naming it; a
fraction limit of one without a length gets Lightning's error (a MisconfigurationException) first."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer.api.errors import MisconfigurationException
from trainer.data.loader_reading import read_loader
from trainer.data.ready_batches import CycledLoaders, ReadyBatches, batch_length, first_of, refuse_on_ranks


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
def test_an_iterable_of_batches_is_read_as_ready_batches(limit):
    user = read_loader(Batches(), "val_dataloader()", limit=("limit_val_batches", limit))
    assert isinstance(user.dataset, ReadyBatches) and user.batch_size == 1 and user.collate_fn is first_of
    assert [first_of([batch])[0].shape for batch in user.dataset] == [torch.Size([2, 2])] * 4
    with pytest.raises(TypeError, match="no length"):
        len(user.dataset)  # (NotImplementedError: no length, as Lightning reads it)


def test_an_object_that_is_not_iterable_is_refused():
    with pytest.raises(TypeError, match=r"val_dataloader\(\) must return a torch.utils.data.DataLoader, an iterable of "
                                        "ready batches \\(or None\\), got object"):
        read_loader(object(), "val_dataloader()")


def test_ready_batches_are_refused_on_several_processes_with_one_line():
    with pytest.raises(TypeError, match=r"train_dataloader\(\) gave Batches, an iterable of ready batches .* one "
                                        "process only.* 2 processes"):
        refuse_on_ranks(Batches(), "train_dataloader()", 2)
    refuse_on_ranks(Batches(), "train_dataloader()", 1)  # one process: read as it is


def test_several_loaders_cycle_the_shorter_ones_as_max_size_cycle():
    long, short = [[0], [1], [2], [3], [4]], [["a"], ["b"]]
    assert list(CycledLoaders([long, short])) == [[[0], ["a"]], [[1], ["b"]], [[2], ["a"]], [[3], ["b"]], [[4], ["a"]]]
    assert list(CycledLoaders({"x": short, "y": long[:3]})) == [
        {"x": ["a"], "y": [0]}, {"x": ["b"], "y": [1]}, {"x": ["a"], "y": [2]}]
    assert len(CycledLoaders((long, short))) == 5 and list(CycledLoaders((short, short)))[0] == (["a"], ["a"])


def test_an_evaluation_batch_weighs_its_first_tensors_length():
    assert batch_length([torch.zeros(3, 2), torch.zeros(5)]) == 3
    assert batch_length({"x": torch.zeros(4, 1)}) == 4
    assert batch_length(torch.tensor(1.0)) == 1 and batch_length(["text"]) == 1
