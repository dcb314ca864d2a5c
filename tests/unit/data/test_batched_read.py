"""A micro-batch of a ``TensorDataset`` (or a ``Subset`` of one) with the default collate is read in one
gather per tensor, and gives exactly what per-sample reads and ``default_collate`` give; every other
dataset keeps what it had: its ``__getitems__``, or per-sample reads under the batch's position seed."""

from functools import partial

import pytest
import torch
from torch.utils.data import DataLoader, Subset, TensorDataset, default_collate, random_split

from trainer import Trainer, TrainModule
from trainer.data import loaders
from trainer.data.batched_read import TensorGather, batch_reader
from trainer.data.loaders import InProcessLoader, LoaderOptions, build_loader
from trainer.runtime.seeding import derive_seed, seeded

INDICES = [7, 0, 3, 3, 11, 5, 2]  # out of order, one repeated


def _tensors(n: int = 12) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(
        torch.randn(n, 5, generator=generator),  # features
        torch.arange(n) * 10,  # int64 labels: each sample a 0-d tensor
        torch.rand(n, 2, 3, generator=generator) > 0.5,  # bool, 3-d
        torch.randint(0, 255, (n, 3, 4, 4), generator=generator, dtype=torch.uint8),  # images
    )


def _same_batch(got, expected) -> None:
    assert type(got) is type(expected) and len(got) == len(expected)
    for field, (a, b) in enumerate(zip(got, expected)):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), field


def _per_sample(dataset, indices):
    return default_collate([dataset[i] for i in indices])


def _datasets():
    data = _tensors()
    nested = Subset(Subset(data, [11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0]), list(range(11, -1, -1)))
    return {
        "tensors": data,
        "one tensor": TensorDataset(torch.arange(24.0).reshape(12, 2)),
        "subset, negative indices": Subset(data, [-1, 3, -12, 4, 5, 6, 7, 8, 9, 10, 0, 2]),
        "subset, tensor indices": Subset(data, torch.arange(11, -1, -1)),
        "nested subsets": nested,
        "random_split": random_split(data, [12, 0], generator=torch.Generator().manual_seed(1))[0],
    }


@pytest.mark.parametrize("name", list(_datasets()))
def test_a_gather_reads_what_per_sample_reads_and_the_default_collate_give(name):
    dataset = _datasets()[name]
    reader = batch_reader(dataset, default_collate)
    assert isinstance(reader, TensorGather)
    _same_batch(reader(INDICES), _per_sample(dataset, INDICES))
    _same_batch(batch_reader(dataset, TrainModule().collate_fn)(INDICES), _per_sample(dataset, INDICES))


def test_batches_are_gathered_only_where_that_is_exact():
    data = _tensors()

    class Augmented(TensorDataset):  # may override __getitem__ (and draw random numbers there)
        pass

    class OwnCollate(TrainModule):
        def collate_fn(self, samples):
            return default_collate(samples)

    x = torch.randn(12, 3)
    refused = {
        "a subclass": (Augmented(*data.tensors), default_collate),
        "a subset of a subclass": (Subset(Augmented(*data.tensors), [0, 1]), default_collate),
        "a collate_fn of the user's": (data, lambda samples: default_collate(samples)),
        "an overridden collate_fn": (data, OwnCollate().collate_fn),
        "a non-contiguous tensor": (TensorDataset(torch.randn(3, 12).t()), default_collate),
        "a tensor that requires grad": (TensorDataset(x.requires_grad_()), default_collate),
        "a tensor subclass": (TensorDataset(torch.nn.Parameter(torch.randn(12, 2), requires_grad=False)), default_collate),
        "a sparse tensor": (TensorDataset(torch.eye(12).to_sparse()), default_collate),
    }
    for what, (dataset, collate) in refused.items():
        assert batch_reader(dataset, collate) is None, what
        assert not loaders.draws_no_random_numbers(dataset, collate), what


def test_without_workers_or_pinning_the_batches_are_read_in_this_process():
    data = _tensors()
    batches = [INDICES, [1, 2], [4]]
    loader = build_loader(data, batches, default_collate, LoaderOptions(), seed=0)
    assert isinstance(loader, InProcessLoader) and len(loader) == 3
    for _ in range(2):  # iterable again, like a DataLoader
        for got, indices in zip(loader, batches, strict=True):
            _same_batch(got, _per_sample(data, indices))
    for options in (LoaderOptions(pin_memory=True), LoaderOptions(num_workers=1), LoaderOptions(timeout=5)):
        assert isinstance(build_loader(data, batches, default_collate, options, seed=0), DataLoader), options


def test_loader_workers_gather_the_same_batches_as_per_sample_reads():
    data = _datasets()["subset, negative indices"]
    batches = [INDICES, [1, 2], [4, 9, 8]]
    per_sample = list(build_loader(data, batches, lambda samples: default_collate(samples), LoaderOptions(), seed=0))
    for options in (LoaderOptions(), LoaderOptions(num_workers=2)):
        gathered = list(build_loader(data, batches, default_collate, options, seed=0))
        assert len(gathered) == len(per_sample) == 3
        for got, expected in zip(gathered, per_sample):
            _same_batch(got, expected)


class _CountedGetitems(torch.utils.data.Dataset):
    """A dataset with its own batch read (``__getitems__``); ``__getitem__`` must not be used."""

    def __init__(self, n: int = 64):
        generator = torch.Generator().manual_seed(2)
        self.x, self.y = torch.randn(n, 4, generator=generator), torch.randn(n, 1, generator=generator)
        self.batch_reads, self.seen = 0, []

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        raise AssertionError("read per sample although the dataset reads batches")

    def __getitems__(self, indices):
        self.batch_reads += 1
        self.seen.append(list(indices))
        return [(self.x[i], self.y[i]) for i in indices]


class _Linear(TrainModule):
    def __init__(self, data):
        super().__init__(optimizer=partial(torch.optim.SGD, lr=0.01))
        self.net, self.data, self.batches = torch.nn.Linear(4, 1), data, []

    def train_dataset(self):
        return self.data

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.batches.append((x.clone(), y.clone()))
        return torch.nn.functional.mse_loss(self.net(x), y)


def test_a_dataset_with_getitems_is_read_through_it_with_the_plans_indices(tmp_path):
    data = _CountedGetitems()
    module = _Linear(data)
    trainer = Trainer(max_steps=6, batch_size=8, accumulate_grad_batches=2, loggers=[], progress_bar=False,
                      checkpoint=None, enable_model_summary=False, num_sanity_val_steps=0, run_dir=str(tmp_path))
    trainer.fit(module)
    assert data.batch_reads == 12 == len(module.batches)  # one call per micro-batch, none per sample
    from trainer.data.batch_plan import GlobalBatchPlan

    plan = GlobalBatchPlan(64, 8, 2, 1, seed=trainer.seed)
    expected = [list(m.indices) for step in range(6) for m in plan.step_plan(step // 4, step % 4, 0).micro_batches]
    assert data.seen == expected
    for (x, y), indices in zip(module.batches, expected):
        assert torch.equal(x, data.x[indices]) and torch.equal(y, data.y[indices])


class _Noisy(TensorDataset):
    """Draws a random number per sample read (an augmentation)."""

    reads = 0

    def __getitem__(self, index):
        type(self).reads += 1
        x, = super().__getitem__(index)
        return x + torch.rand(()), torch.rand(())


def test_a_dataset_that_draws_random_numbers_is_read_per_sample_under_the_batch_position_seed(monkeypatch):
    gathers = []
    monkeypatch.setattr(TensorGather, "__call__", lambda self, indices: gathers.append(indices))
    data = _Noisy(torch.arange(12.0))
    batches = [[3, 1, 4], [1, 5], [9, 2, 6]]
    torch.manual_seed(123)
    training_draw = torch.rand(())
    torch.manual_seed(123)
    got = list(build_loader(data, batches, default_collate, LoaderOptions(), seed=77, first_batch=5))
    assert torch.rand(()) == training_draw  # the training's stream is left alone
    assert gathers == [] and _Noisy.reads == 8
    for i, (batch, indices) in enumerate(zip(got, batches)):
        with seeded(derive_seed(77, "batch", 5 + i)):
            _same_batch(batch, _per_sample(data, indices))

