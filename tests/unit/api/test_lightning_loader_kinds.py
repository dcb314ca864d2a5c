"""Loaders other than a DataLoader over a map-style set, under ``trainer.lightning`` with Lightning itself
as the oracle (the same module, tests/support/loader_kinds_modules.py, run under both): iterables of
ready batches (with a length, without one, with a ``__len__`` that raises ``NotImplementedError``),
several training loaders (Lightning's ``CombinedLoader`` "max_size_cycle"), ``IterableDataset`` streams
for test / predict under ``limit_*_batches``, and a training stream that is empty in an epoch. Each
compares the hook calls, the weights (rtol 1e-6: the same float operations in the same order, up to
the loss scaling's summation order) and the logged values. The same loaders on 2 ranks against one
process: tests/multiprocess/api/test_lightning_ready_batches_ranks.py (streams:
tests/multiprocess/api/test_lightning_stream_eval_ranks.py)."""

from __future__ import annotations

import pytest
import torch

import trainer.lightning as ours
from tests.support.lightning_loop_modules import callback_numbers, run_both, run_call
from tests.support.loader_kinds_modules import EmptyEpochsSteps, ReadySteps, Unsized, build, samples

pl = pytest.importorskip("lightning.pytorch")
TOL = dict(rtol=1e-6, atol=1e-7)


def both(tmp_path, steps, module_args=None, call="fit", **flags):
    """[(module, trainer, result) under Lightning, the same under trainer.lightning]."""
    return run_both(pl, build, tmp_path, steps, module_args, call, **flags)


metrics = callback_numbers


def assert_same(pl_run, our_run, step_values=True):
    """``step_values`` False: under accumulation a step value here is the global batch's mean, Lightning's
    the last micro-batch's (docs/lightning.md), so the ``*_step`` values are not compared."""
    (pl_module, pl_trainer, _), (module, trainer, _) = pl_run, our_run
    assert module.calls == pl_module.calls
    assert trainer.global_step == pl_trainer.global_step
    assert trainer.current_epoch == pl_trainer.current_epoch
    torch.testing.assert_close(module.layer.weight, pl_module.layer.weight, **TOL)
    torch.testing.assert_close(module.layer.bias, pl_module.layer.bias, **TOL)
    expected = {k: v for k, v in metrics(pl_trainer).items() if step_values or not k.endswith("_step")}  # (ours holds the trainer's own train/... and perf/... too: docs/lightning.md)
    assert {k: v for k, v in metrics(trainer).items() if k in expected} == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("kind", ["unsized", "len_raises", "sized", "list"])
@pytest.mark.parametrize("accumulate", [1, 2])
def test_an_iterable_of_ready_batches_trains_and_validates_as_lightning(tmp_path, kind, accumulate):
    pl_run, our_run = both(tmp_path, ReadySteps, {"kind": kind}, max_epochs=2, accumulate_grad_batches=accumulate)
    assert_same(pl_run, our_run, step_values=accumulate == 1)
    assert our_run[0].calls.count(("validation_step", 1, 2)) == 1  # 3 validation batches of 2 in each epoch
    assert our_run[1].train_dataloader.__class__.__name__ == pl_run[1].train_dataloader.__class__.__name__


@pytest.mark.parametrize("kind", ["unsized", "len_raises"])
def test_limits_cut_iterables_without_a_length_as_lightning(tmp_path, kind):
    pl_run, our_run = both(tmp_path, ReadySteps, {"kind": kind}, max_epochs=2, limit_train_batches=3,
                           limit_val_batches=2, val_check_interval=1.0)
    assert_same(pl_run, our_run)
    assert our_run[1].global_step == 6


@pytest.mark.parametrize("kind", ["several", "several_dict"])
def test_several_training_loaders_cycle_as_lightning_max_size_cycle(tmp_path, kind):
    pl_run, our_run = both(tmp_path, ReadySteps, {"kind": kind}, max_epochs=2, limit_val_batches=0)
    assert_same(pl_run, our_run)
    assert our_run[1].global_step == 8  # the longest loader's 4 batches per epoch


def test_several_shuffled_training_loaders_under_overfit_batches_read_in_order_as_lightning(tmp_path):
    pl_run, our_run = both(tmp_path, ReadySteps, {"kind": "several_shuffled"}, max_epochs=2, overfit_batches=1.0)
    assert_same(pl_run, our_run)
    assert all(isinstance(loader.sampler, torch.utils.data.SequentialSampler) for loader in our_run[1].train_dataloader)


@pytest.mark.parametrize("kind", ["stream", "sized_stream", "unsized", "len_raises"])
@pytest.mark.parametrize("limit", [None, 2])
def test_streams_and_ready_batches_test_and_predict_as_lightning(tmp_path, kind, limit):
    results = {}
    for side, package in (("lightning", pl), ("ours", ours)):
        module = build(package, ReadySteps)(kind=kind)
        trainer, tested = run_call(package, module, "test", str(tmp_path / side), limit_test_batches=limit,
                                   limit_predict_batches=limit)
        count = trainer.num_test_batches  # (the last call's: read before predict)
        predicted = trainer.predict(module)
        results[side] = (module.calls, tested, predicted, count)
    (pl_calls, pl_tested, pl_predicted, pl_count), (calls, tested, predicted, count) = results.values()
    assert calls == pl_calls
    assert tested[0] == pytest.approx(pl_tested[0], rel=1e-6)
    assert len(predicted) == len(pl_predicted) == (limit or 4)  # 10 samples in batches of 3
    torch.testing.assert_close(torch.cat(predicted), torch.cat(pl_predicted), **TOL)
    assert count == [limit or 4]


def test_a_fraction_of_a_stream_without_length_is_lightnings_error(tmp_path):
    module = build(ours, ReadySteps)(kind="stream")
    trainer = ours.Trainer(logger=False, enable_progress_bar=False, limit_test_batches=0.5,
                           default_root_dir=str(tmp_path))
    with pytest.raises(ours.utilities.exceptions.MisconfigurationException,
                       match=r"IterableDataset`.*limit_test_batches\)`.*`1.0` or an int"):
        trainer.test(module)


@pytest.mark.parametrize("at_all", [False, True])
def test_an_empty_training_stream_ends_its_epoch_as_lightning(tmp_path, at_all):
    pl_run, our_run = both(tmp_path, EmptyEpochsSteps, {"at_all": at_all}, max_epochs=2)
    (_, pl_trainer, _), (module, trainer, _) = pl_run, our_run
    assert trainer.global_step == pl_trainer.global_step == 3 * at_all
    assert trainer.current_epoch == pl_trainer.current_epoch == 2
    assert module.calls == pl_run[0].calls  # validation only after an epoch that trained
    assert ("validation_step", 0, 0) in module.calls and ("validation_step", 1, 0) not in module.calls if at_all \
        else not any(call[0] == "validation_step" for call in module.calls)
