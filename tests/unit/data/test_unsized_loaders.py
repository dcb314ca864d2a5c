"""A loader that is not a DataLoader: an iterable of ready batches is read as a stream of batches,
anything else is refused with one line naming it; a fraction limit of one without a length gets
Lightning's error (a MisconfigurationException) first. On several processes each rank keeps its rows
of every ready batch (``ready_batch_rows``; the 2-rank runs:
tests/multiprocess/api/test_lightning_ready_batches_ranks.py)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer.api.errors import MisconfigurationException
from trainer.data.loader_reading import read_loader
from trainer.data.ready_batches import CycledLoaders, ReadyBatches, batch_length, first_of
from trainer.data.ready_rows import ready_batch_rows


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


def test_each_rank_keeps_its_rows_of_a_ready_batch_as_the_plan_deals_a_micro_step():
    x, y = torch.arange(10.0).view(5, 2), torch.arange(5)
    batch = {"x": x, "more": (y, [y * 2]), "n": 7, "scalar": torch.tensor(3.0)}
    first, weight0 = ready_batch_rows(batch, 0, 2, None, "train_dataloader()")
    second, weight1 = ready_batch_rows(batch, 1, 2, None, "train_dataloader()")
    assert (weight0, weight1) == (3 / 5, 2 / 5)  # 5 rows on 2 ranks: 3 and 2, rank 0 first
    assert torch.equal(first["x"], x[:3]) and torch.equal(second["x"], x[3:])
    assert torch.equal(second["more"][0], y[3:]) and torch.equal(second["more"][1][0], y[3:] * 2)
    assert isinstance(second["more"], tuple) and second["n"] == 7 and torch.equal(second["scalar"], torch.tensor(3.0))
    assert ready_batch_rows(batch, 0, 1, None, "w") == (batch, 1)  # one process: the batch as it is


def test_a_rank_without_rows_runs_a_padding_batch_and_a_batch_without_rows_is_whole_everywhere():
    rows, weight = ready_batch_rows((torch.ones(1, 2),), 1, 2, None, "w")
    assert weight == 0 and rows[0].shape == (1, 2)  # the first row, weighing nothing
    assert ready_batch_rows(["text", 3], 1, 2, None, "w") == (["text", 3], 1 / 2)


def test_tensors_with_different_first_dimensions_are_refused_on_several_processes():
    with pytest.raises(ValueError, match=r"train_dataloader\(\): a ready batch holds tensors with first dimensions 3, "
                                         r"4; on 2 processes"):
        ready_batch_rows((torch.ones(4, 2), torch.ones(3)), 0, 2, None, "train_dataloader()")


def test_several_loaders_parts_are_cut_each_by_its_rows_and_must_share_alike():
    combined = {"a": torch.arange(4.0), "b": (torch.arange(6.0), torch.ones(6, 1))}
    rows, weight = ready_batch_rows(combined, 1, 2, ["a", "b"], "w")
    assert weight == 1 / 2 and torch.equal(rows["a"], torch.tensor([2.0, 3.0])) and rows["b"][1].shape == (3, 1)
    rows, weight = ready_batch_rows([torch.ones(3), torch.ones(6)], 0, 3, [0, 1], "w")
    assert weight == 1 / 3 and [part.shape[0] for part in rows] == [1, 2]
    with pytest.raises(ValueError, match=r"w: a combined batch of several training loaders \('a': 4 rows, 'b': 3 rows\) "
                                         r"cannot be cut into the same share on each of 2 processes"):
        ready_batch_rows({"a": torch.ones(4), "b": torch.ones(3)}, 0, 2, ["a", "b"], "w")


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


def _ready_plan(source, mode="invariant", rank=1):
    from types import SimpleNamespace

    from trainer.data.loaders import LoaderOptions
    from trainer.data.streaming.ready_plan import ReadyBatchPlan

    trainer = SimpleNamespace(stream_mode=mode, seed=0, strategy=SimpleNamespace(owns_step=False, device="cpu"))
    batch = SimpleNamespace(drop_last=False, batch_size=1, accumulate_grad_batches=2)
    return ReadyBatchPlan(ReadyBatches(source, "train_dataloader()"), trainer, batch, 2, rank, first_of, LoaderOptions())


def test_a_ready_batch_plan_takes_accumulate_batches_per_step_and_this_ranks_rows_of_each():
    source = [torch.arange(3.0), torch.arange(4.0) + 10, torch.arange(1.0) + 20]
    plan = _ready_plan(source)
    assert plan.global_batch_size == 2 and plan.estimated_steps == 2
    steps = []
    for step in plan.rank_steps(0, 1):
        batches = plan.rank_batches(0, 1)
        steps.append([(micro.num_real, next(batches).tolist()) for micro in step.micro_batches] + [step.global_count])
    # rank 1 of 2: row 2 of 3 (weight 1/3), rows 2-3 of 4 (1/2), then a padding batch of row 0 (weight 0)
    assert steps == [[(1 / 3, [2.0]), (1 / 2, [12.0, 13.0]), 2], [(0, [20.0]), 1]]


def test_a_ready_batch_plan_refuses_sharded_streams_on_several_ranks():
    with pytest.raises(ValueError, match=r"data.stream_mode=sharded with train_dataloader\(\)'s list, an iterable of "
                                         r"ready batches, on 2 data-parallel ranks: .* use data.stream_mode=invariant"):
        _ready_plan([torch.ones(2)], mode="sharded")
