"""Streaming (iterable) datasets (trainer/data/streaming/): invariant mode equals one process on any world
size and resumes exactly after kill -9, also on another world size; sharded mode reads every sample
exactly once per epoch over ranks and workers and resumes bitwise on the same world size; clear errors.

Tolerances: 1 process vs 2 ranks: rtol=1e-5, atol=1e-6 (gradient sums in another order); a
resume on the same world size: bitwise.
"""

import json
import os
import re
import shutil
from collections import Counter

import pytest
import torch

from tests.support.helpers import REPO, fit, new_trainer, read_metrics
from tests.support.run_fit import run_fit
from tests.support.stream_modules import SIZES, IdShards, StreamRegressor
from trainer import ShardedIterable, Trainer
from trainer.checkpoint import layout

pytestmark = pytest.mark.timeout(600)
STEPS = 18  # invariant: 7 steps per epoch (50 samples, global batch 8, the last one short): 3 epochs
EVERY = 3
KILL_AT = 8  # dies after step 8; the last checkpoint is step 6, mid-stream in epoch 0
TOL = dict(rtol=1e-5, atol=1e-6)
SINGLE = dict(strategy="single", devices=1, batch_size=8)
DDP = dict(strategy="ddp", devices=2, batch_size=4)


def losses_by_step(run_dir):
    return {r["step"]: r["train/loss"] for r in read_metrics(str(run_dir)) if "train/loss" in r}


def stream_args(layout_args, workers, mode):
    return dict(layout_args, num_workers=workers, stream_mode=mode, max_steps=STEPS,
                checkpoint=dict(every_n_steps=EVERY, keep_last=None))


def killed_at_step(run_dir, args, **module):
    """Run in a process of its own that SIGKILLs itself after step KILL_AT (after the step-6 checkpoint committed)."""
    spec = {"run_dir": str(run_dir), "module_class": "tests.support.stream_modules.StreamRegressor",
            "module": dict(module, kill_at_step=KILL_AT), "trainer": args}
    killed = run_fit(spec, timeout=300)  # python tests/support/run_fit.py <spec>, forked warm (tests/support/warm_process.py)
    assert killed.returncode != 0, killed.stderr[-3000:]
    assert max(losses_by_step(run_dir)) == KILL_AT
    assert layout.find_latest(str(run_dir / "checkpoints")).endswith("step-000000006")


def assert_same(losses, params, reference, exact):
    ref_losses, ref_params = reference
    assert sorted(losses) == list(range(1, STEPS + 1))
    got = [losses[s] for s in range(1, STEPS + 1)]
    if exact:
        assert got == ref_losses
    else:
        torch.testing.assert_close(torch.tensor(got), torch.tensor(ref_losses), **TOL)
    for name, value in ref_params.items():
        if exact:
            assert torch.equal(params[name], value), name
        else:
            torch.testing.assert_close(params[name], value, **TOL)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_invariant_stream_equals_one_process_and_resumes_exactly(tmp_path, workers):
    # A validation stream too (without workers: each pass would start them again, slow under spawned ranks).
    validating = dict(val_every_n_steps=6, num_sanity_val_steps=0) if workers == 0 else {}
    reference = fit(tmp_path / "one", StreamRegressor(val=not workers), **stream_args(SINGLE, workers, "invariant"),
                    **validating)
    assert len(reference[0]) == STEPS
    two = fit(tmp_path / "two", StreamRegressor(val=not workers), **stream_args(DDP, workers, "invariant"), **validating)
    assert_same(dict(enumerate(two[0], 1)), two[1], reference, exact=False)
    if workers == 0:  # validation: 1 process == 2 ranks
        val_one, val_two = ([r["val/loss"] for r in read_metrics(str(tmp_path / d)) if "val/loss" in r] for d in ("one", "two"))
        assert len(val_one) == 3
        torch.testing.assert_close(torch.tensor(val_two), torch.tensor(val_one), **TOL)
    # kill -9 mid-stream, then resume=auto: with 0 workers on another world size (exact within TOL),
    # with 2 workers on the same one (bitwise, DDP 2).
    killed_layout, resume_layout, exact = (SINGLE, DDP, False) if workers == 0 else (DDP, DDP, True)
    run_dir = tmp_path / "killed"
    killed_at_step(run_dir, stream_args(killed_layout, workers, "invariant"))
    if workers == 0:  # the same killed run also resumed on its own world size (single -> single): bitwise
        shutil.copytree(run_dir, tmp_path / "killed_copy")
        _, params = fit(tmp_path / "killed_copy", StreamRegressor(), resume="auto", **stream_args(SINGLE, 0, "invariant"))
        assert_same(losses_by_step(tmp_path / "killed_copy"), params, reference, exact=True)
    _, params = fit(run_dir, StreamRegressor(), resume="auto", **stream_args(resume_layout, workers, "invariant"))
    assert_same(losses_by_step(run_dir), params, reference if workers == 0 else two, exact=exact)


def ids_per_epoch(run_dir, ranks):
    seen: dict[int, list[list[int]]] = {}
    for rank in range(ranks):
        with open(os.path.join(run_dir, f"ids-{rank}.jsonl")) as handle:
            for line in handle:
                epoch, ids = json.loads(line)
                seen.setdefault(epoch, []).append(ids)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_sharded_stream_reads_every_sample_once_and_resumes_exactly(tmp_path, workers):
    args = stream_args(DDP, workers, "sharded")
    reference = fit(tmp_path / "whole", StreamRegressor(record=True, val=not workers), **args)
    if workers == 0:  # a validation stream, each rank its own shards (the sanity pass and the final one)
        assert any("val/loss" in r for r in read_metrics(str(tmp_path / "whole")))
    seen = ids_per_epoch(tmp_path / "whole", ranks=2)
    for epoch in (0, 1):  # finished epochs: every sample exactly once over ranks and workers
        counts = Counter(i for ids in seen[epoch] for i in ids)
        assert sorted(counts) == list(range(sum(SIZES))) and set(counts.values()) == {1}, (epoch, counts)
    assert seen[0] != seen[1]  # another shard order (and in-shard order) in epoch 1
    run_dir = tmp_path / "killed"
    killed_at_step(run_dir, args)
    _, params = fit(run_dir, StreamRegressor(), resume="auto", **args)
    assert_same(losses_by_step(run_dir), params, reference, exact=True)
    if workers == 0:  # another world size: an error naming both
        with pytest.raises(Exception, match="on 2 data-parallel ranks; this run has 1"):
            fit(run_dir, StreamRegressor(), resume="auto", **dict(args, **SINGLE, max_steps=STEPS + 3))
        # One process, sharded: killed and resumed bitwise too.
        single = stream_args(SINGLE, 0, "sharded")
        reference = fit(tmp_path / "single", StreamRegressor(), **single)
        killed_at_step(tmp_path / "single_killed", single)
        _, params = fit(tmp_path / "single_killed", StreamRegressor(), resume="auto", **single)
        assert_same(losses_by_step(tmp_path / "single_killed"), params, reference, exact=True)
        # (its last checkpoint is mid-epoch) another num_workers reads the stream otherwise: an error naming both
        with pytest.raises(ValueError, match="saved with data.num_workers=0, this run has data.num_workers=2"):
            fit(tmp_path / "single_killed", StreamRegressor(), resume="auto", **dict(single, num_workers=2,
                                                                                      max_steps=STEPS + 3))


# ----- clear errors and the plain (protocol-free) stream: in process, one rank -------------------------------
class PlainStream(torch.utils.data.IterableDataset):
    """No shard protocol: one shard, ``iter(dataset)`` after ``set_epoch``."""

    def __init__(self):
        self.x, self.y = IdShards().x, IdShards().y
        self.epochs = []

    def set_epoch(self, epoch):
        self.epochs.append(epoch)

    def __iter__(self):
        return iter({"id": i, "x": self.x[i], "y": self.y[i]} for i in range(len(self.x)))


class PlainStreamRegressor(StreamRegressor):
    def train_dataset(self):
        return PlainStream()


def test_plain_iterable_dataset_is_one_shard_and_epochs_end_with_it(tmp_path):
    trainer = new_trainer(tmp_path / "plain", batch_size=8, max_steps=-1, max_epochs=2)
    module = PlainStreamRegressor()
    trainer.fit(module)
    assert trainer.global_step == 14  # 2 epochs of 7 steps (50 samples: 6 x 8 + 2)
    assert len(read_metrics(str(tmp_path / "plain"))) >= 14
    trainer = new_trainer(tmp_path / "limited", batch_size=8, max_steps=-1, max_epochs=2, limit_train_batches=3)
    trainer.fit(PlainStreamRegressor())
    assert trainer.global_step == 6  # an int limit_train_batches ends each epoch's stream after 3 steps
    # The docs' streaming example (its code block, run in process): 4 shards x 100 samples, batch 16.
    with open(os.path.join(REPO, "docs", "how-to", "data.md")) as f:
        code = next(b for b in re.findall(r"```python\n(.*?)```", f.read(), re.S) if "class Shards(ShardedIterable)" in b)
    namespace = {"__name__": "readme_stream"}
    exec(code, namespace)
    trainer = new_trainer(tmp_path / "readme", max_steps=-1, max_epochs=1, batch_size=16)
    trainer.fit(namespace["StreamModule"]())
    assert trainer.global_step == 25


def test_bad_stream_mode_is_refused():
    with pytest.raises(ValueError, match="data.stream_mode='bogus': give one of invariant, sharded"):
        Trainer(stream_mode="bogus")


def test_too_few_shards_names_shards_world_and_workers(tmp_path):
    trainer = new_trainer(tmp_path, batch_size=8, stream_mode="sharded", num_workers=8)
    with pytest.raises(ValueError, match=r"n_shards=6 for data-parallel world size 1 x 8 reader\(s\).*num_workers=8"):
        trainer.fit(StreamRegressor())


class NeedsLength(StreamRegressor):
    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.01)
        total = self.trainer.estimated_stepping_batches
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.LinearLR(optimizer, total_iters=total)}


def test_settings_that_need_the_epoch_length_are_errors_without_len(tmp_path):
    with pytest.raises(RuntimeError, match="stream without __len__.*set trainer.max_steps"):
        new_trainer(tmp_path / "a", batch_size=8, max_steps=-1, max_epochs=1).fit(NeedsLength())
    with pytest.raises(ValueError, match="trainer.limit_train_batches=0.5 is a fraction of an epoch"):
        new_trainer(tmp_path / "b", batch_size=8, limit_train_batches=0.5).fit(StreamRegressor())
    # With __len__ the length is an estimate: the schedule gets 7 steps, the epoch still ends with the stream.
    trainer = new_trainer(tmp_path / "c", batch_size=8, max_steps=-1, max_epochs=1, val_check_interval=0.5)
    trainer.fit(NeedsLength(with_len=True, val=True))
    assert trainer.global_step == 7
    # val_check_interval=0.5 of the estimated 7 steps: validation every 3 steps (and at the end)
    validated = [row["step"] for row in read_metrics(str(tmp_path / "c")) if any(k.startswith("val/") for k in row)]
    assert validated == [3, 6, 7], validated


@pytest.mark.parametrize("mode, syncs", [("invariant", 0), ("sharded", 1)])
def test_quiet_stream_steps_make_no_host_sync_in_invariant_mode(tmp_path, mode, syncs):
    # One process, no workers: invariant mode reads no tensor on a quiet step; sharded mode makes its
    # one agreement per step (the step's sample count), read on the host.
    from tests.support.helpers import HotPathProbe, read_hot_path

    new_trainer(tmp_path, batch_size=2, accumulate_grad_batches=2, max_steps=8, log_every_n_steps=4,
                stream_mode=mode, callbacks=[HotPathProbe()]).fit(StreamRegressor())
    windows = read_hot_path(tmp_path, 1)[0]
    for step in (3, 6, 7):  # quiet steps (see tests/multiprocess/observe/test_hot_path.py)
        assert windows[step]["syncs"] == syncs, (step, windows[step]["where"])
        assert all(w.startswith("plan.py") for w in windows[step]["where"]), windows[step]["where"]


class RandomCollate(StreamRegressor):
    """A collate that draws random numbers (masking-style): its draws come from generators keyed by
    the micro-batch's position, so the training's own stream and a resumed run are unaffected."""

    drawn: list = []

    def collate_fn(self, samples):
        RandomCollate.drawn.append(torch.rand(1).item())
        return super().collate_fn(samples)


def test_stream_guards_and_seeded_collate(tmp_path):
    # A plain IterableDataset is one shard: workers past the first would read nothing (or lose samples).
    with pytest.raises(ValueError, match="without the shard protocol.*data.num_workers=2"):
        new_trainer(tmp_path / "a", batch_size=8, num_workers=2).fit(PlainStreamRegressor())
    # sharded + drop_last would drop whole shards of the ranks that are not short yet.
    with pytest.raises(ValueError, match="data.drop_last=true with data.stream_mode=sharded"):
        new_trainer(tmp_path / "b", batch_size=8, stream_mode="sharded", drop_last=True).fit(StreamRegressor())
    # sharded: no __len__ estimate (the busiest rank decides the epoch's steps).
    with pytest.raises(RuntimeError, match="a sharded stream"):
        new_trainer(tmp_path / "c", batch_size=8, stream_mode="sharded", max_steps=-1, max_epochs=1).fit(
            type("ShardedNeedsLength", (NeedsLength,), {})(with_len=True))
    # The collate's draws depend on the position only: two runs draw the same, and not the global stream's.
    runs = []
    for name in ("d", "e"):
        RandomCollate.drawn = []
        torch.manual_seed(123 if name == "d" else 456)  # a different global state before fit
        new_trainer(tmp_path / name, batch_size=8, max_steps=3).fit(RandomCollate())
        runs.append(list(RandomCollate.drawn))
    assert runs[0] == runs[1] and len(set(runs[0])) == len(runs[0])


# ----- a rank's stream failing: every rank fails at once, naming it (never a wait until the collective timeout) --
class EmptyFirstShard(StreamRegressor):
    """2 shards: shard 0 (the epoch's first under seed 1) empty, shard 1 of 8 samples; sharded on 2
    ranks, rank 0 reads only the empty shard and pads every step."""

    def train_dataset(self):
        return IdShards(sizes=(0, 8))


def test_empty_shard_pads_and_a_missing_rank_position_fails_every_rank(tmp_path):
    from trainer.data.streaming.protocol import shard_order
    from trainer.runtime.launch import WorkerFailed

    assert shard_order(2, 1, 0)[0] == 0 and shard_order(2, 1, 1)[0] == 0  # the empty shard comes first
    args = dict(DDP, stream_mode="sharded", seed=1, max_steps=3, collective_timeout_s=20,
                checkpoint=dict(every_n_steps=1, keep_last=None))
    fit(tmp_path, EmptyFirstShard(record=True), **args)  # 2 steps per epoch: rank 1 reads 8 samples, rank 0 pads
    assert not os.path.exists(tmp_path / "ids-0.jsonl")  # rank 0 trained on padding only (weight 0)
    with open(tmp_path / "ids-1.jsonl") as handle:
        first_epoch = [i for epoch, ids in map(json.loads, handle) if epoch == 0 for i in ids]
    assert sorted(first_epoch) == list(range(8))
    latest = layout.find_latest(str(tmp_path / "checkpoints"))
    assert latest.endswith("step-000000003")  # mid-epoch 1: each rank's position is needed
    # Rank 1's position gone, and unknown to the commit record (a node-local disk, a hand-copied checkpoint):
    # the integrity check cannot see it, the restore must name it on every rank.
    os.remove(os.path.join(latest, "stream", "rank-00001.pt"))
    with open(os.path.join(latest, "COMMITTED")) as handle:
        marker = json.load(handle)
    del marker["files"]["stream/rank-00001.pt"]
    with open(os.path.join(latest, "COMMITTED"), "w") as handle:
        json.dump(marker, handle)
    with pytest.raises(WorkerFailed, match=r"no stream position for rank\(s\) \[1\]"):
        fit(tmp_path, EmptyFirstShard(), resume="auto", **dict(args, max_steps=4))


# ----- validation stream settings and readers that draw random numbers: in process, one rank ------------------
class DrawingShards(IdShards):
    """IdShards whose reader draws from the global generators (torch and random) for each sample."""

    def shard_samples(self, shard, epoch):
        import random as random_module

        for sample in super().shard_samples(shard, epoch):
            torch.rand(1), random_module.random()  # drawn and thrown away: the samples stay IdShards'
            yield sample


class DrawingReaders(StreamRegressor):
    def train_dataset(self):
        return DrawingShards()

    def val_dataset(self):
        from tests.support.stream_modules import VAL_SIZES

        return DrawingShards(sizes=VAL_SIZES)


def test_stream_readers_drawing_random_numbers_leave_the_training_stream_alone(tmp_path):
    # num_workers=0: the readers run in the training process; dropout draws from the global stream.
    args = dict(batch_size=8, max_steps=6, val_every_n_steps=2, num_sanity_val_steps=0)
    reference = fit(tmp_path / "quiet", StreamRegressor(val=True, dropout=0.3), **args)
    drawing = fit(tmp_path / "drawing", DrawingReaders(dropout=0.3), **args)
    assert len(reference[0]) == 6 and drawing[0] == reference[0]
    for name, value in reference[1].items():
        assert torch.equal(drawing[1][name], value), name


class ValLoaderStream(StreamRegressor):
    def __init__(self, **loader):
        super().__init__()
        self.loader = loader

    def val_dataloader(self):
        from tests.support.stream_modules import VAL_SIZES

        return torch.utils.data.DataLoader(IdShards(sizes=VAL_SIZES), batch_size=4, **self.loader)


def test_validation_stream_refuses_persistent_workers_and_honours_pin_memory(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"val_dataloader\(\).*persistent_workers=True cannot be honoured for a stream"):
        new_trainer(tmp_path / "a", batch_size=8, max_steps=2).fit(
            ValLoaderStream(num_workers=1, persistent_workers=True))
    from trainer.data.streaming import validation

    pinned = []
    monkeypatch.setattr(validation, "pin_batch", lambda batch, pin_memory: pinned.append(pin_memory) or batch)
    new_trainer(tmp_path / "b", batch_size=8, max_steps=2, num_sanity_val_steps=0).fit(
        ValLoaderStream(pin_memory=True))
    assert pinned and all(pinned)  # every validation batch goes through the pinning (a no-op without CUDA)
