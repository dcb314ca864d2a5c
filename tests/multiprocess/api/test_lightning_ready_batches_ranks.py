"""Loaders that are not DataLoaders on 2 ranks (the trainer spawns them) equal one process on the same
batches: iterables of ready batches with a length, without one (endless, under ``max_steps``), several
training loaders cycled together (from the hook or given to ``fit``), and validation / test / predict over
ready batches; several loaders whose batches cannot share alike stop every rank with one line. In training every
rank reads the whole iterable and keeps its rows of each batch (an odd batch splits 2 / 1, a batch of one
row leaves rank 1 a padding batch); in evaluation the ranks run whole batches in turn. Compared: the
steps, the weights (rtol 1e-5, atol 1e-6: each batch's mean is a sum over two ranks in another order,
then the steps compound it) and the logged means. The one-process runs are checked against Lightning
itself in tests/unit/api/test_lightning_loader_kinds.py."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

import trainer.lightning as L
from tests.support.lightning_loop_modules import run_call
from tests.support.loader_kinds_modules import Ready, Unsized, samples

pytestmark = pytest.mark.timeout(600)
TOL = dict(rtol=1e-5, atol=1e-6)


def _fit(tmp_path, ranks, kind, strategy="ddp", train_batch=4, shuffle=False, **flags):
    torch.manual_seed(0)
    module = Ready(kind=kind, train_batch=train_batch, shuffle=shuffle)
    initial = module.layer.weight.detach().clone()
    if ranks > 1:
        flags.update(strategy=strategy, devices=ranks, accelerator="cpu")
    trainer, _ = run_call(L, module, "fit", str(tmp_path / str(ranks)), **flags)
    assert not torch.equal(module.layer.weight, initial)  # it trained
    return module, trainer


def _assert_same(one, two, names):
    (one_module, one_trainer), (two_module, two_trainer) = one, two
    assert two_trainer.global_step == one_trainer.global_step
    torch.testing.assert_close(two_module.layer.weight, one_module.layer.weight, **TOL)
    torch.testing.assert_close(two_module.layer.bias, one_module.layer.bias, **TOL)
    for name in names:
        assert float(two_trainer.callback_metrics[name]) == pytest.approx(float(one_trainer.callback_metrics[name]),
                                                                          rel=1e-5)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_an_iterable_with_a_length_trains_and_validates_on_two_ranks_as_one_process(tmp_path, strategy):
    # 16 samples in batches of 3: 3, 3, 3, 3, 3, 1 (odd batches, and one row for two ranks); 2 per step.
    flags = dict(max_epochs=2, accumulate_grad_batches=2)
    one = _fit(tmp_path, 1, "sized", train_batch=3, **flags)
    two = _fit(tmp_path, 2, "sized", strategy, train_batch=3, **flags)
    assert one[1].global_step == 6
    assert one[1].global_batch_size == two[1].global_batch_size == 2  # ready batches per step, on any world size
    _assert_same(one, two, ("l_epoch", "v"))


def test_an_endless_iterable_trains_to_max_steps_on_two_ranks_as_one_process(tmp_path):
    # It wraps a shuffling DataLoader (16 samples, batches of 4): every rank draws the same order, each pass.
    flags = dict(max_steps=5, max_epochs=-1, limit_val_batches=0, shuffle=True)
    one, two = _fit(tmp_path, 1, "endless", **flags), _fit(tmp_path, 2, "endless", **flags)
    assert one[1].global_step == 5
    _assert_same(one, two, ("l_step",))


@pytest.mark.parametrize("kind", ["several", "several_dict", "several_shuffled"])
def test_several_training_loaders_cycle_on_two_ranks_as_one_process(tmp_path, kind):
    # list: 16 and 6 samples in batches of 4 (the second cycles: 4, 2, 4, 2), shuffled or not; dict: batches of
    # 2 and 4.
    flags = dict(max_epochs=2, limit_val_batches=0)
    one, two = _fit(tmp_path, 1, kind, **flags), _fit(tmp_path, 2, kind, **flags)
    assert one[1].global_step == 8
    _assert_same(one, two, ("l_epoch",))


def _evaluate(tmp_path, ranks, kind, limit, strategy):
    flags = dict(strategy=strategy, devices=ranks, accelerator="cpu") if ranks > 1 else {}
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(tmp_path / str(ranks)), limit_val_batches=limit,
                        limit_test_batches=limit, limit_predict_batches=limit, **flags)
    module = Ready(kind=kind)
    validated = trainer.validate(module, verbose=False)[0]["v"]
    tested = trainer.test(module, verbose=False)[0]["t"]
    return validated, tested, torch.cat(trainer.predict(module))


@pytest.mark.parametrize("kind, limit, strategy", [("unsized", None, "ddp"), ("sized", 3, "fsdp")])
def test_validate_test_and_predict_over_ready_batches_on_two_ranks_as_one_process(tmp_path, kind, limit, strategy):
    # test / predict: 10 samples in batches of 3 (4 batches; limit 3: rank 1 pads under FSDP's lockstep).
    validated, tested, predicted = _evaluate(tmp_path, 1, kind, limit, strategy)
    validated2, tested2, predicted2 = _evaluate(tmp_path, 2, kind, limit, strategy)
    assert (validated2, tested2) == (pytest.approx(validated, rel=1e-6), pytest.approx(tested, rel=1e-6))
    assert len(predicted) == min(10, 3 * (limit or 4))
    torch.testing.assert_close(predicted2, predicted, rtol=1e-6, atol=1e-7)


def test_loaders_given_to_fit_train_on_two_ranks_as_one_process(tmp_path):
    # fit(train_dataloaders=[a DataLoader, a wrapper around one]): several loaders, one of them ready batches.
    results = []
    for ranks in (1, 2):
        torch.manual_seed(0)
        module = Ready(kind="several")
        loaders = [DataLoader(samples(8), batch_size=4), Unsized(DataLoader(samples(6, 1.0), batch_size=2))]
        flags = dict(strategy="ddp", devices=2, accelerator="cpu") if ranks > 1 else {}
        trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, default_root_dir=str(tmp_path / str(ranks)), max_epochs=2,
                            limit_val_batches=0, log_every_n_steps=1, **flags)
        trainer.fit(module, train_dataloaders=loaders)
        results.append((module, trainer))
    assert results[0][1].global_step == 6  # the wrapper's 3 batches per epoch: the longest
    _assert_same(results[0], results[1], ("l_epoch",))


def test_several_loaders_whose_batches_split_unalike_stop_every_rank_with_one_line(tmp_path):
    loaders = [DataLoader(samples(8), batch_size=4), DataLoader(samples(6, 1.0), batch_size=3)]
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(tmp_path), max_epochs=1, limit_val_batches=0, strategy="ddp", devices=2,
                        accelerator="cpu")
    with pytest.raises(Exception, match=r"a combined batch of several training loaders \(0: 4 rows, 1: 3 rows\) cannot "
                                        r"be cut into the same share on each of 2 processes"):
        trainer.fit(Ready(kind="several"), train_dataloaders=loaders)
