"""Validation on a stream (an IterableDataset, trainer/data/streaming/validation.py): read as the pass goes,
not whole into memory first; a finite stream without ``__len__`` validates fully with exact means over
the ranks (DDP and FSDP's lockstep, both stream modes); an endless one validates ``limit_val_batches``
batches; and one read with no limit for longer than the collective timeout says so.

Reference: the mean squared error of the same module over every validation sample, computed here in
one process (rtol 1e-5, atol 1e-6: sums in another order).
"""

from __future__ import annotations

import itertools
import logging

import pytest
import torch

from tests.support.helpers import Regressor, new_trainer, read_metrics
from tests.support.stream_modules import VAL_SIZES, IdShards

pytestmark = pytest.mark.timeout(300)
TOL = dict(rtol=1e-5, atol=1e-6)


class CountingShards(IdShards):
    """IdShards that count the samples their readers gave (read in this process: num_workers=0)."""

    def __init__(self, sizes):
        super().__init__(sizes=sizes)
        self.read = 0

    def shard_samples(self, shard, epoch):
        for sample in super().shard_samples(shard, epoch):
            self.read += 1
            yield sample


class EndlessShards(IdShards):
    """One shard that never ends: samples 0, 1, ..., n-1, 0, 1, ... (no __len__)."""

    def __init__(self, size=20):
        super().__init__(sizes=(size,))

    def shard_samples(self, shard, epoch):
        for index in itertools.cycle(range(self.sizes[0])):
            yield {"id": index, "x": self.x[index], "y": self.y[index]}


class StreamValidation(Regressor):
    """A Regressor (its weights built in __init__, the same in every copy) validated on ``stream``;
    records, per pass, how many samples the stream had given when its first validation_step ran."""

    def __init__(self, stream=None):
        super().__init__()
        self.stream = stream
        self.read_at_first_step = []
        self.val_batches = None  # trainer.num_val_batches at the end of the last pass

    def val_dataset(self):
        self._val = self.stream
        return self._val

    def validation_step(self, batch, batch_idx):
        if batch_idx == 0 and hasattr(self._val, "read"):
            self.read_at_first_step.append(self._val.read)
        return super().validation_step((batch["x"], batch["y"]), batch_idx)

    def on_validation_end(self):
        self.val_batches = list(self.trainer.num_val_batches)


def expected_mse(module, dataset, ids):
    """The exact mean squared error of ``module`` over the samples ``ids`` of ``dataset``."""
    module.eval()
    with torch.no_grad():
        x, y = dataset.x[ids], dataset.y[ids]
        return torch.nn.functional.mse_loss(module(x), y).item()


def test_a_validation_stream_is_read_as_the_pass_goes(tmp_path):
    # 400 samples, validation batch 8: the first step must not wait for (or hold) the whole stream.
    stream = CountingShards(sizes=(100, 100, 100, 100))
    module = StreamValidation(stream)
    trainer = new_trainer(tmp_path, batch_size=8, max_steps=1, num_sanity_val_steps=0)
    results = trainer.validate(module)
    assert module.read_at_first_step and module.read_at_first_step[0] <= 8, module.read_at_first_step
    assert stream.read == 400  # and then all of it
    fresh = StreamValidation(CountingShards(sizes=(100, 100, 100, 100)))
    torch.testing.assert_close(results["val/loss"], expected_mse(fresh, stream, list(range(400))), **TOL)
    assert module.val_batches == [50]


@pytest.mark.parametrize("strategy, mode", [("ddp", "sharded"), ("fsdp", "sharded"), ("fsdp", "invariant")])
def test_a_finite_stream_without_len_validates_fully_with_exact_means(tmp_path, strategy, mode):
    # Uneven shards (5, 9, 3, 8): the ranks run different numbers of batches; under FSDP (lockstep)
    # the short rank pads with weight 0, in sharded mode agreeing batch by batch.
    stream = IdShards(sizes=VAL_SIZES)
    module = StreamValidation(stream)
    trainer = new_trainer(tmp_path, strategy=strategy, devices=2, batch_size=4, stream_mode=mode, max_steps=1,
                          collective_timeout_s=120)
    results = trainer.validate(module)
    reference = expected_mse(StreamValidation(stream), stream, list(range(sum(VAL_SIZES))))
    torch.testing.assert_close(results["val/loss"], reference, **TOL)


def test_an_endless_stream_validates_the_limit(tmp_path):
    stream = EndlessShards(size=20)
    module = StreamValidation(stream)
    trainer = new_trainer(tmp_path, batch_size=4, max_steps=1, limit_val_batches=3)
    results = trainer.validate(module)
    # 3 global batches of 4: the stream's first 12 samples (one shard, read in order).
    torch.testing.assert_close(results["val/loss"], expected_mse(StreamValidation(stream), stream, list(range(12))),
                               **TOL)
    assert module.val_batches == [3]


class StopAfter(StreamValidation):
    """Ends the pass (an error) once it has run ``seconds``: an endless pass would never end itself."""

    def __init__(self, stream, seconds):
        super().__init__(stream)
        self.seconds = seconds

    def validation_step(self, batch, batch_idx):
        import time

        self._started = getattr(self, "_started", time.monotonic())
        if time.monotonic() - self._started > self.seconds:
            raise RuntimeError("stopped by the test")
        return super().validation_step(batch, batch_idx)


def test_an_endless_stream_without_a_limit_is_not_read_silently(tmp_path, caplog):
    trainer = new_trainer(tmp_path, batch_size=4, max_steps=1, collective_timeout_s=0.5)
    with caplog.at_level(logging.WARNING, logger="trainer"), pytest.raises(RuntimeError, match="stopped by the test"):
        trainer.validate(StopAfter(EndlessShards(size=20), seconds=1.5))
    notices = [r.getMessage() for r in caplog.records if "a stream without __len__" in r.getMessage()]
    assert len(notices) == 1, notices
    assert "EndlessShards" in notices[0] and "trainer.limit_val_batches" in notices[0], notices


class PersistentTrainLoader(StreamValidation):
    """Training from a loader with persistent workers; validation from a stream (val_dataset)."""

    def train_dataloader(self):
        from tests.support.helpers import regression_data

        return torch.utils.data.DataLoader(regression_data(64), batch_size=8, num_workers=1, persistent_workers=True)


def test_persistent_workers_of_the_train_loader_are_not_silently_dropped_for_a_validation_stream(tmp_path, caplog):
    stream = IdShards(sizes=VAL_SIZES)
    with caplog.at_level(logging.WARNING, logger="trainer"):
        new_trainer(tmp_path, max_steps=2, val_every_n_steps=2, num_sanity_val_steps=0).fit(
            PersistentTrainLoader(stream))
    warnings = [r.getMessage() for r in caplog.records if "persistent_workers=True (train_dataloader())" in r.getMessage()]
    assert len(warnings) == 1 and "validation stream of val_dataset()" in warnings[0], warnings
    val = [r["val/loss"] for r in read_metrics(str(tmp_path)) if "val/loss" in r]
    assert len(val) == 1  # and the stream validated
