"""The module's own data, honoured or refused.

Data drawn in the data hooks is the same on every rank; a user's DataLoader keeps its batch size,
sampler, order and worker settings (or is refused with an error naming the value); a
``val_dataloader()`` is validated on; an IterableDataset and a global batch larger than the
dataset get a clear message (test_user_data_edge_cases.py). Tolerances as in test_equivalence.py (CPU fp32, all-reduce order).
"""

import json
import os
import re
import sys
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    RandomSampler,
    Sampler,
    SequentialSampler,
    TensorDataset,
    WeightedRandomSampler,
)
from torch.utils.data.distributed import DistributedSampler

from tests.support.helpers import REPO, read_metrics, run_trainer, train_losses
from trainer import Trainer, TrainModule

pytestmark = pytest.mark.timeout(240)
TOL = dict(rtol=1e-5, atol=1e-6)
NUM_SAMPLES, MINORITY = 120, 12  # class 1: the first 12 samples (10%)


def labelled_data(num_samples: int = NUM_SAMPLES) -> TensorDataset:
    """(x, y, index): the index lets a test see which samples each step trained on."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(num_samples, 6, generator=generator)
    y = (torch.arange(num_samples) < MINORITY).float().unsqueeze(1)
    return TensorDataset(x, y, torch.arange(num_samples))


class EpochRecorder(Sampler):
    """A generator-free custom sampler with ``set_epoch``: every other sample, reversed on odd epochs."""

    def __init__(self, size: int):
        self.size, self.epochs = size, []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __iter__(self):
        order = list(range(0, self.size, 2))
        return iter(order[::-1] if self.epochs and self.epochs[-1] % 2 else order)

    def __len__(self) -> int:
        return len(range(0, self.size, 2))


class LoaderModule(TrainModule):
    """Regression on ``labelled_data`` through ``train_dataloader()`` (``loader`` holds its keyword
    arguments; ``sampler``: None, "weighted" or "recorder"); records the sample indices of every step
    in ``<run_dir>/seen_rank<r>.json``."""

    def __init__(self, sampler: str | None = None, val_batch_size: int | None = None, **loader):
        super().__init__(optimizer=partial(torch.optim.SGD, lr=0.05, momentum=0.9))
        torch.manual_seed(0)
        self.net = nn.Linear(6, 1)
        self.sampler_kind, self.loader_args, self.val_batch_size = sampler, loader, val_batch_size
        self.steps, self.current, self.val_batches = [], [], []

    def train_dataloader(self):
        data = labelled_data()
        sampler = None
        if self.sampler_kind == "weighted":  # balances the two classes
            weights = torch.where(data.tensors[1][:, 0] > 0, 1.0 / MINORITY, 1.0 / (NUM_SAMPLES - MINORITY))
            sampler = WeightedRandomSampler(weights, num_samples=NUM_SAMPLES)
        elif self.sampler_kind == "recorder":
            sampler = self.recorder = EpochRecorder(NUM_SAMPLES)
        return DataLoader(data, sampler=sampler, **self.loader_args)

    def val_dataloader(self):
        if self.val_batch_size is None:
            return None
        return DataLoader(labelled_data(13), batch_size=self.val_batch_size)

    def training_step(self, batch, batch_idx):
        x, y, index = batch
        self.current.extend(index.tolist())
        return F.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y, _ = batch
        self.val_batches.append(len(x))
        return F.mse_loss(self.net(x), y)

    def on_train_step_end(self, step, metrics):
        self.steps.append(self.current)
        self.current = []

    def on_fit_end(self):
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        record = {"steps": self.steps, "val_batches": self.val_batches,
                  "epochs": getattr(getattr(self, "recorder", None), "epochs", None), "batch_size": self.trainer.batch_size}
        with open(os.path.join(self.trainer.run_dir, f"seen_rank{rank}.json"), "w") as f:
            json.dump(record, f)
        torch.save(self.net.state_dict(), os.path.join(self.trainer.run_dir, f"params_rank{rank}.pt"))


def seen(run_dir, rank=0):
    with open(os.path.join(str(run_dir), f"seen_rank{rank}.json")) as f:
        return json.load(f)


# ----- item 2: the data hooks draw the same numbers on every rank ---------------------------------------
def readme_module(tmp_path):
    """The README's "Writing your own module" code, imported as a module (spawned workers import it too)."""
    with open(os.path.join(REPO, "README.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    code = next(block for block in blocks if "class MyModule(TrainModule)" in block)
    (tmp_path / "readme_example.py").write_text(code)
    sys.path.insert(0, str(tmp_path))
    try:
        import readme_example
    finally:
        sys.path.remove(str(tmp_path))  # (children of spawn got it already, and keep it)
    return readme_example, code


def test_readme_example_trains_the_same_on_one_process_and_two_ranks(tmp_path):
    module, code = readme_module(tmp_path)
    # The README runs it as 2 ranks x 16: one process x 32 must train the same (its data is torch.randn).
    assert 'Trainer(strategy="ddp", devices=2, max_steps=100, batch_size=16)' in code
    sys.path.insert(0, str(tmp_path))
    try:
        torch.manual_seed(0)
        run_trainer(tmp_path / "single", module.MyModule(), batch_size=32, max_steps=5)
        torch.manual_seed(0)
        run_trainer(tmp_path / "ddp", module.MyModule(), strategy="ddp", devices=2, batch_size=16, max_steps=5)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("readme_example", None)
    single, ddp = train_losses(str(tmp_path / "single")), train_losses(str(tmp_path / "ddp"))
    assert len(single) == 5
    torch.testing.assert_close(torch.tensor(ddp), torch.tensor(single), **TOL)


class SplitRecorder(TrainModule):
    """Draws its data from the global generators (an unseeded ``random_split`` of ``torch.randn``
    data) and records, per rank, the split and the first number its rank's own stream gives after."""

    def __init__(self, draw: bool = True):
        super().__init__(optimizer=partial(torch.optim.SGD, lr=0.1))
        self.draw = draw
        self.net = nn.Linear(4, 1)

    def train_dataset(self):
        if not self.draw:
            return TensorDataset(torch.zeros(40, 4), torch.zeros(40, 1))
        full = TensorDataset(torch.randn(50, 4), torch.randn(50, 1))
        self.split, _ = torch.utils.data.random_split(full, [40, 10])
        return self.split

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.mse_loss(self.net(x), y)

    def on_fit_start(self):
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        record = {"rank_stream": torch.rand(1).item(), "split": list(getattr(self, "split", range(0)).indices)
                  if self.draw else [], "first_x": self.split.dataset.tensors[0][0].tolist() if self.draw else []}
        with open(os.path.join(self.trainer.run_dir, f"split_rank{rank}.json"), "w") as f:
            json.dump(record, f)


def test_data_hooks_draw_the_same_data_on_every_rank_and_leave_the_rank_streams_alone(tmp_path):
    run_trainer(tmp_path / "ddp", SplitRecorder(), strategy="ddp", devices=2, batch_size=4, max_steps=1)
    ranks = [json.loads((tmp_path / "ddp" / f"split_rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["split"] == ranks[1]["split"] and ranks[0]["first_x"] == ranks[1]["first_x"]
    assert ranks[0]["rank_stream"] != ranks[1]["rank_stream"]  # dropout etc. still differ per rank
    run_trainer(tmp_path / "single", SplitRecorder(), batch_size=8, max_steps=1)
    single = json.loads((tmp_path / "single" / "split_rank0.json").read_text())
    assert single["split"] == ranks[0]["split"]
    # Drawing the data did not move the rank's own stream: the same as a module that draws nothing.
    run_trainer(tmp_path / "quiet", SplitRecorder(draw=False), batch_size=8, max_steps=1)
    assert json.loads((tmp_path / "quiet" / "split_rank0.json").read_text())["rank_stream"] == single["rank_stream"]


# ----- item 3: a user's DataLoader --------------------------------------------------------------------------
def test_loader_batch_size_and_order_are_honoured(tmp_path):
    module = LoaderModule(batch_size=16, shuffle=False, drop_last=True)
    trainer_args = dict(max_steps=-1, max_epochs=1)
    run_trainer(tmp_path, module, **trainer_args)
    record = seen(tmp_path)
    assert record["batch_size"] == 16
    # shuffle=False: dataset order; drop_last: 120 = 7 x 16 + 8, the short last batch is dropped.
    assert record["steps"] == [list(range(16 * s, 16 * s + 16)) for s in range(7)]
    shuffled = LoaderModule(batch_size=16, shuffle=True)
    run_trainer(tmp_path / "shuffled", shuffled, max_steps=2)
    first = seen(tmp_path / "shuffled")["steps"][0]
    assert len(first) == 16 and first != list(range(16))


def test_loader_batch_size_or_drop_last_against_data_settings_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=r"data.batch_size=8 but train_dataloader\(\) returns a DataLoader with batch_size=16"):
        run_trainer(tmp_path / "a", LoaderModule(batch_size=16), batch_size=8)
    with pytest.raises(ValueError, match=r"data.drop_last=True .* drop_last=False \(DataLoader's default"):
        run_trainer(tmp_path / "b", LoaderModule(batch_size=16), drop_last=True)
    with pytest.raises(ValueError, match=r"data.num_workers=1 .* num_workers=0"):
        run_trainer(tmp_path / "c", LoaderModule(batch_size=16), num_workers=1)
    # Equal values are fine.
    run_trainer(tmp_path / "d", LoaderModule(batch_size=16), batch_size=16, max_steps=1)


def test_weighted_sampler_keeps_its_class_balance_and_global_batches(tmp_path):
    run_trainer(tmp_path / "single", LoaderModule("weighted", batch_size=16), max_steps=6)
    run_trainer(tmp_path / "ddp", LoaderModule("weighted", batch_size=8), strategy="ddp", devices=2, max_steps=6)
    single = seen(tmp_path / "single")["steps"]
    ddp = [seen(tmp_path / "ddp", r)["steps"] for r in range(2)]
    assert len(single) == 6 and all(len(step) == 16 for step in single)
    for step in range(6):  # the same samples in every global step on 1 and 2 ranks
        assert sorted(ddp[0][step] + ddp[1][step]) == sorted(single[step])
    torch.testing.assert_close(torch.tensor(train_losses(str(tmp_path / "ddp"))),
                               torch.tensor(train_losses(str(tmp_path / "single"))), **TOL)
    drawn = [i for step in single for i in step]
    minority = sum(i < MINORITY for i in drawn) / len(drawn)
    assert 0.35 < minority < 0.65, minority  # balanced by the weights (10% in the dataset)
    assert len(set(drawn)) < len(drawn)  # drawn with replacement, as the sampler does


def test_custom_sampler_gets_set_epoch_and_gives_the_order(tmp_path):
    module = LoaderModule("recorder", batch_size=20)
    run_trainer(tmp_path, module, max_steps=-1, max_epochs=2)
    record = seen(tmp_path)
    assert record["epochs"] == [0, 1]
    evens = list(range(0, NUM_SAMPLES, 2))
    assert record["steps"] == [evens[:20], evens[20:40], evens[40:], evens[::-1][:20], evens[::-1][20:40], evens[::-1][40:]]


def test_resume_mid_epoch_with_a_sampler_is_exact(tmp_path):
    # 120 weighted draws per epoch / 16 = 8 steps: saved at step 6, resumed across the epoch boundary.
    whole = LoaderModule("weighted", batch_size=16)
    run_trainer(tmp_path / "whole", whole, max_steps=11)
    first = LoaderModule("weighted", batch_size=16)
    run_trainer(tmp_path / "first", first, max_steps=6, checkpoint=dict(every_n_steps=6, format="full"))
    resumed = LoaderModule("weighted", batch_size=16)
    run_trainer(tmp_path / "resumed", resumed, max_steps=11, resume=str(tmp_path / "first" / "checkpoints"))
    assert seen(tmp_path / "first")["steps"] + seen(tmp_path / "resumed")["steps"] == seen(tmp_path / "whole")["steps"]
    losses = {r["step"]: r["train/loss"] for r in read_metrics(str(tmp_path / "resumed")) if "train/loss" in r}
    assert sorted(losses) == list(range(7, 12))
    assert [losses[s] for s in range(7, 12)] == train_losses(str(tmp_path / "whole"))[6:]
    # ... and those were the sampler's draws (mostly the minority class), not the trainer's permutation.
    drawn = [i for step in seen(tmp_path / "whole")["steps"] for i in step]
    assert sum(i < MINORITY for i in drawn) / len(drawn) > 0.35


class CountWorkers:
    """A worker_init_fn that leaves one file per call in ``directory``."""

    def __init__(self, directory):
        self.directory = str(directory)

    def __call__(self, worker_id):
        open(os.path.join(self.directory, f"worker{worker_id}_{os.getpid()}"), "w").close()


def test_worker_settings_are_honoured(tmp_path):
    (tmp_path / "workers").mkdir()
    module = LoaderModule(batch_size=40, num_workers=2, persistent_workers=True, prefetch_factor=3,
                          worker_init_fn=CountWorkers(tmp_path / "workers"))
    run_trainer(tmp_path / "run", module, max_steps=-1, max_epochs=2)
    assert len(seen(tmp_path / "run")["steps"]) == 6
    # worker_init_fn ran in each of the 2 workers, once: they persisted into the second epoch.
    assert len(os.listdir(tmp_path / "workers")) == 2
    from trainer.data.loaders import LoaderOptions, build_loader

    loader = build_loader(labelled_data(), [[0, 1]], lambda s: s, LoaderOptions(num_workers=2, prefetch_factor=3,
                          pin_memory=True, persistent_workers=True, timeout=5), seed=0)
    assert (loader.prefetch_factor, loader.pin_memory, loader.persistent_workers, loader.timeout) == (3, True, True, 5)


class OwnBatches(Sampler):
    def __iter__(self):
        return iter([[0, 1], [2, 3]])

    def __len__(self):
        return 2


@pytest.mark.parametrize("make, message", [
    (lambda d: DataLoader(d, batch_sampler=OwnBatches()), "custom batch_sampler"),
    (lambda d: DataLoader(d, batch_sampler=BatchSampler(SequentialSampler(d), 4, False)), "custom batch_sampler"),
    (lambda d: DataLoader(d, batch_size=None), "batch_size=None"),
    (lambda d: DataLoader(d, batch_size=4, shuffle=True, generator=torch.Generator()), "generator="),
    (lambda d: DataLoader(d, batch_size=4, sampler=RandomSampler(d, generator=torch.Generator())), "own generator"),
    (lambda d: DataLoader(d, batch_size=4, sampler=DistributedSampler(d, num_replicas=2, rank=0)), "DistributedSampler"),
    (lambda d: DataLoader(d, batch_size=4, num_workers=1, in_order=False), "in_order=False"),
])
def test_loader_settings_that_cannot_be_honoured_are_refused(make, message):
    from trainer.data.user_loader import read_loader

    with pytest.raises(ValueError, match=re.escape(message)):
        read_loader(make(labelled_data(8)), "train_dataloader()")


def test_honoured_loader_reading():
    from trainer.data.user_loader import read_loader

    data = labelled_data(8)
    assert read_loader(DataLoader(data, batch_size=4, shuffle=True), "x").shuffle
    plain = read_loader(DataLoader(data, batch_size=4), "x")
    assert not plain.shuffle and plain.sampler is None and plain.batch_size == 4
    weighted = WeightedRandomSampler(torch.ones(8), 8)
    assert read_loader(DataLoader(data, batch_size=4, sampler=weighted), "x").sampler is weighted
    # RandomSampler with replacement is a sampler like any other: its stream is honoured.
    sampler = RandomSampler(data, replacement=True, num_samples=5)
    assert read_loader(DataLoader(data, batch_size=4, sampler=sampler), "x").sampler is sampler


def test_batch_size_default_and_bad_values():
    assert Trainer().batch_size == 32 and Trainer().drop_last is False
    for args, message in ((dict(batch_size=-4), "data.batch_size must be an integer >= 1, got -4"),
                          (dict(drop_last="yes"), "data.drop_last must be true, false or null"),
                          (dict(pin_memory=1), "data.pin_memory must be true, false or null")):
        with pytest.raises(ValueError, match=re.escape(message)):
            Trainer(**args)


# ----- item 4: val_dataloader() ---------------------------------------------------------------------------------
def test_val_dataloader_is_validated_on_with_its_own_batch_size(tmp_path):
    # (no sanity pass: its validation_step calls would be recorded too)
    run_trainer(tmp_path / "single", LoaderModule(batch_size=16, val_batch_size=5), max_steps=2, num_sanity_val_steps=0)
    run_trainer(tmp_path / "ddp", LoaderModule(batch_size=8, val_batch_size=5), strategy="ddp", devices=2, max_steps=2,
                num_sanity_val_steps=0)
    val = lambda run: [r["val/loss"] for r in read_metrics(str(tmp_path / run)) if "val/loss" in r]  # noqa: E731
    assert len(val("single")) == 1
    torch.testing.assert_close(torch.tensor(val("ddp")), torch.tensor(val("single")), **TOL)
    assert seen(tmp_path / "single")["val_batches"] == [5, 5, 3]
    # 13 samples over 2 ranks, no duplicates: rank 0 takes 7 (5 + 2), rank 1 takes 6 (5 + 1).
    assert [seen(tmp_path / "ddp", r)["val_batches"] for r in range(2)] == [[5, 2], [5, 1]]
    net = nn.Linear(6, 1)
    net.load_state_dict(torch.load(str(tmp_path / "single" / "params_rank0.pt")))
    x, y, _ = labelled_data(13).tensors
    assert val("single")[0] == pytest.approx(F.mse_loss(net(x), y).item(), rel=1e-6)


def test_val_loader_with_a_sampler_validates_its_stream_and_drop_last_leaves_out_the_short_last_batch():
    from trainer.data.user_loader import RunData

    class WithSampler(LoaderModule):
        def val_dataloader(self):
            data = labelled_data(13)
            return DataLoader(data, batch_size=3, sampler=WeightedRandomSampler(torch.ones(13), 9, replacement=False),
                              num_workers=1, persistent_workers=True, collate_fn=list)

    trainer = Trainer(batch_size=4)
    data = RunData(WithSampler(batch_size=4), trainer)
    shards = [data.val_shard(0, r, 2) for r in range(2)]
    positions = [i for shard in shards for batch in shard for i in batch]
    assert len(positions) == 9 and len(set(positions)) == 9  # the stream's 9 draws, once over the ranks
    assert all(len(batch) <= 3 for shard in shards for batch in shard)
    assert data.val_shard(0, 0, 2) == shards[0]  # drawn again the same
    # Its own batch size and worker settings, not data.batch_size / the train loader's.
    assert (data.val_batch_size, data.val_options.num_workers, data.val_options.persistent_workers) == (3, 1, True)
    assert data.val_collate is list and data.train_options.num_workers == 0

    class DropLast(LoaderModule):
        def val_dataloader(self):
            return DataLoader(labelled_data(13), batch_size=3, drop_last=True)

    # drop_last=True: the samples of one process's full batches (12 of 13), once over the ranks, on any world size.
    dropped = RunData(DropLast(batch_size=4), Trainer())
    for world_size in (1, 2, 3):
        covered = sorted(i for r in range(world_size) for batch in dropped.val_shard(0, r, world_size) for i in batch)
        assert covered == list(range(12)), world_size

    class NothingLeft(LoaderModule):
        def val_dataloader(self):
            return DataLoader(labelled_data(2), batch_size=3, drop_last=True)

    with pytest.raises(ValueError, match=r"val_dataloader\(\): drop_last=True with batch_size=3 leaves none"):
        RunData(NothingLeft(batch_size=4), Trainer()).val_shard(0, 0, 1)
