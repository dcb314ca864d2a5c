"""Token windows (``recipes/token_data.py``'s ``PackedBlocks`` over memory-mapped shards or arrays in
memory, ``recipes/hf_text.py``'s ``PackedText``) are read as one gather per micro-batch, and that read
gives exactly what per-sample reads and ``default_collate`` give: the same samples in the same order,
the same dtypes and shapes, in a loader worker too; a short training and a run resumed mid-epoch
train bitwise on the same batches as per-sample reads."""

from __future__ import annotations

import os
from functools import partial

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Subset, default_collate

from tests.support.helpers import read_metrics, run_trainer
from trainer import TrainModule
from trainer.data import loaders
from trainer.data.batched_read import OwnGather, batch_reader
from trainer.data.loaders import InProcessLoader, LoaderOptions, build_loader
from trainer.recipes.gpt import ByteBlocks
from trainer.recipes.hf_text import PackedText
from trainer.recipes.token_data import PackedBlocks

pytestmark = pytest.mark.timeout(300)
BLOCK = 6
PART_TOKENS = [40, 3, 27, 64]  # windows per part: 6, 0 (too short), 4, 10
VOCAB = 50
INDICES = [3, 0, 17, 17, -1, 7, 5, 10, -20, 6]  # out of order, across parts, repeated, negative


def shard_files(folder, dtype: str = "<u2") -> list[str]:
    generator = np.random.default_rng(0)
    paths = []
    for number, tokens in enumerate(PART_TOKENS):
        path = os.path.join(str(folder), f"train_{number:05d}.bin")
        generator.integers(0, VOCAB, tokens).astype(dtype).tofile(path)
        paths.append(path)
    return paths


def _per_sample(dataset, indices):
    return default_collate([dataset[i] for i in indices])


def _same_batch(got, expected) -> None:
    assert type(got) is type(expected) and len(got) == len(expected)
    for field, (a, b) in enumerate(zip(got, expected)):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), field
        assert a.is_contiguous(), field


class PerSampleBlocks(PackedBlocks):
    """The same windows, read per sample (a subclass that overrides ``__getitem__``)."""

    def __getitem__(self, index):
        return super().__getitem__(index)


def _layouts(folder) -> dict:
    memmapped = PackedBlocks(shard_files(folder), BLOCK, np.dtype("<u2"))
    text = torch.from_numpy(np.random.default_rng(1).integers(0, 256, 200).astype(np.uint8))
    packed = PackedText.__new__(PackedText)  # (its samples as PackedText holds them, without a Hugging Face source)
    packed.samples = torch.randint(0, 300, (21, BLOCK + 1), generator=torch.Generator().manual_seed(2), dtype=torch.int32)
    return {
        "memory-mapped shards": memmapped,
        "arrays in memory": PackedBlocks([np.arange(100, dtype=np.uint32), np.arange(50, dtype=np.uint32)[::-1].copy()],
                                         BLOCK),
        "byte blocks (a subclass that reads as its base)": ByteBlocks(text, BLOCK),
        "a subset of shards": Subset(memmapped, list(range(19, -1, -1))),
        "hf text in memory": packed,
    }


@pytest.mark.parametrize("name", ["memory-mapped shards", "arrays in memory", "byte blocks (a subclass that reads as its base)",
                                  "a subset of shards", "hf text in memory"])
def test_a_batch_gather_of_token_windows_reads_what_per_sample_reads_give(name, tmp_path):
    dataset = _layouts(tmp_path)[name]
    reader = batch_reader(dataset, default_collate)
    assert isinstance(reader, OwnGather) and loaders.draws_no_random_numbers(dataset, default_collate)
    _same_batch(reader(INDICES), _per_sample(dataset, INDICES))
    _same_batch(batch_reader(dataset, TrainModule().collate_fn)(INDICES), _per_sample(dataset, INDICES))
    if hasattr(dataset, "__getitems__"):  # DataLoader's batch read, for any collate function
        samples = dataset.__getitems__(INDICES)
        assert len(samples) == len(INDICES)
        for got, expected in zip(samples, [dataset[i] for i in INDICES]):
            _same_batch(list(got), list(expected))


def test_a_window_outside_the_dataset_is_refused_as_per_sample_reads_refuse_it(tmp_path):
    dataset = PackedBlocks(shard_files(tmp_path), BLOCK, np.dtype("<u2"))
    for index in (len(dataset), -len(dataset) - 1):
        with pytest.raises(IndexError, match="out of range for 20 sequences"):
            dataset[index]
        with pytest.raises(IndexError, match="out of range for 20 sequences"):
            dataset.gather_batch([0, index])


def test_a_subclass_that_changes_how_a_sample_is_read_is_read_per_sample(tmp_path):
    dataset = PerSampleBlocks(shard_files(tmp_path), BLOCK, np.dtype("<u2"))
    assert batch_reader(dataset, default_collate) is None
    assert batch_reader(Subset(dataset, [0, 1]), default_collate) is None
    assert batch_reader(PackedBlocks(shard_files(tmp_path), BLOCK, np.dtype("<u2")), lambda s: default_collate(s)) is None


def test_loader_workers_gather_the_windows_into_shared_memory(tmp_path):
    dataset = PackedBlocks(shard_files(tmp_path), BLOCK, np.dtype("<u2"))
    batches = [INDICES, [1, 2], [19, 4, 9]]
    expected = [_per_sample(dataset, indices) for indices in batches]
    assert isinstance(build_loader(dataset, batches, default_collate, LoaderOptions(), seed=0), InProcessLoader)
    for options in (LoaderOptions(), LoaderOptions(num_workers=1)):
        got = list(build_loader(dataset, batches, default_collate, options, seed=0))
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            _same_batch(a, b)
    plain = list(DataLoader(dataset, batch_size=4, num_workers=0))  # torch's DataLoader reads through __getitems__
    for start, batch in zip(range(0, 20, 4), plain):
        _same_batch(batch, _per_sample(dataset, list(range(start, min(start + 4, 20)))))


class SeenWindows(TrainModule):
    """A bigram model on the token shards that records every micro-batch it trains on."""

    def __init__(self, paths: list[str], per_sample: bool):
        super().__init__(optimizer=partial(torch.optim.SGD, lr=0.5, momentum=0.9))
        torch.manual_seed(0)
        self.embed, self.head = nn.Embedding(VOCAB, 8), nn.Linear(8, VOCAB)
        self.paths, self.per_sample, self.seen = paths, per_sample, []

    def train_dataset(self):
        return (PerSampleBlocks if self.per_sample else PackedBlocks)(self.paths, BLOCK, np.dtype("<u2"))

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        self.seen.append((inputs.clone(), targets.clone()))
        return F.cross_entropy(self.head(self.embed(inputs)).flatten(0, 1), targets.flatten())

    def on_fit_end(self):
        torch.save(self.seen, os.path.join(self.trainer.run_dir, "seen.pt"))


def train(run_dir, paths, per_sample: bool, **args) -> tuple[list, dict]:
    """The micro-batches a run trained on and its logged losses (4 windows a micro-batch, 2 a step:
    20 windows are 3 steps an epoch, the last one a micro-batch of 4, so 8 steps cross two epochs' borders)."""
    run_trainer(run_dir, SeenWindows(paths, per_sample), **{"batch_size": 4, "accumulate_grad_batches": 2,
                                                            "max_steps": 8, **args})
    losses = {row["step"]: row["train/loss"] for row in read_metrics(str(run_dir)) if "train/loss" in row}
    return torch.load(os.path.join(str(run_dir), "seen.pt")), losses


def test_a_training_and_a_resume_mid_epoch_read_what_per_sample_reads_read(tmp_path):
    paths = shard_files(tmp_path)
    per_sample, per_sample_losses = train(tmp_path / "per_sample", paths, True)
    batched, losses = train(tmp_path / "batched", paths, False)
    assert len(batched) == len(per_sample) == 5 + 5 + 4
    for got, expected in zip(batched, per_sample):
        _same_batch(list(got), list(expected))
    assert losses == per_sample_losses and len(losses) == 8  # bitwise
    first, first_losses = train(tmp_path / "first", paths, False, max_steps=4, checkpoint=dict(every_n_steps=4))
    resumed, resumed_losses = train(tmp_path / "resumed", paths, False, resume=str(tmp_path / "first" / "checkpoints"))
    assert sorted(resumed_losses) == [5, 6, 7, 8]  # step 4 ends mid-epoch (epoch 2's first step)
    for got, expected in zip(first + resumed, per_sample, strict=True):
        _same_batch(list(got), list(expected))
    assert {**first_losses, **resumed_losses} == per_sample_losses
