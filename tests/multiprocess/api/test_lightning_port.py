"""At home for a Lightning user: A Lightning-style module
(tests/support/lightning_port.py: ``self.log``, ``save_hyperparameters``, val / test / predict dataloaders,
a scheduler dict, Lightning's no-argument epoch hooks) runs with only its import and base class
changed, through fit / validate / test / predict and ``load_from_checkpoint``; one process and 2 DDP
ranks (spawned workers, the same global batch) give the same losses, validation and test metrics
and the same predictions."""

from __future__ import annotations

import os

import pytest
import torch

from tests.support.helpers import read_metrics, new_trainer
from tests.support.lightning_port import PREDICT_SAMPLES, LitRegressor, make_data
from trainer.checkpoint import CheckpointError

pytestmark = pytest.mark.timeout(300)

RTOL = 1e-5
TOL = dict(rtol=1e-5, atol=1e-6)
GLOBAL_BATCH = 16
EPOCHS = 2
STEPS = EPOCHS * -(-203 // GLOBAL_BATCH)  # 13 steps per epoch, the last of 11 samples


def _run(run_dir, **trainer_args):
    """The Lightning user's script: seed, build, fit, then validate / test / predict without a module."""
    devices = trainer_args.get("devices", 1)
    torch.manual_seed(0)  # (L.seed_everything(0)): the same initial weights for both runs
    module = LitRegressor(hidden=12, lr=0.05, batch_size=GLOBAL_BATCH // devices)
    trainer = new_trainer(run_dir, max_steps=-1, max_epochs=EPOCHS, checkpoint=dict(save_last=True), **trainer_args)
    trainer.fit(module)
    result = dict(trainer=trainer, module=module, run_dir=str(run_dir), fit_step=trainer.global_step,
                  fit_epoch=trainer.current_epoch,
                  logged_after_fit=dict(trainer.logged_metrics))
    result["validate"] = trainer.validate()
    result["step_after_validate"] = (trainer.global_step, trainer.current_epoch)
    result["test"] = trainer.test()
    result["step_after_test"] = (trainer.global_step, trainer.current_epoch)
    result["predict"] = trainer.predict()
    result["records"] = read_metrics(str(run_dir))  # read before any later call appends to the file
    return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lightning_port")
    return {"single": _run(root / "single", strategy="single", devices=1),
            "ddp": _run(root / "ddp", strategy="ddp", devices=2)}


def _step_records(records):
    return [r for r in records if "train/loss" in r]


def _latest_checkpoint(run_dir):
    checkpoints = os.path.join(run_dir, "checkpoints")
    steps = sorted(name for name in os.listdir(checkpoints) if name.startswith("step-"))
    assert steps, os.listdir(checkpoints)
    return os.path.join(checkpoints, steps[-1])


def _predict_inputs():
    x, _ = make_data(PREDICT_SAMPLES, seed=4)
    return x


def _predictions(outputs):
    """trainer.predict's per-batch outputs, concatenated: one row per sample."""
    assert all(isinstance(out, torch.Tensor) for out in outputs), [type(out) for out in outputs]
    return torch.cat(outputs)


def test_the_module_runs_as_written_on_one_process(runs):
    single = runs["single"]
    assert single["fit_step"] == STEPS
    assert single["module"].epochs_ended == EPOCHS  # on_train_epoch_end(self): Lightning's shape, called
    assert single["module"].validations_ended >= 1  # on_validation_epoch_end(self)
    steps = _step_records(single["records"])
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))  # log_every_n_steps=1
    # self.log("train_loss", loss) is the step's loss (the whole global batch's mean)
    assert [r["train_loss"] for r in steps] == pytest.approx([r["train/loss"] for r in steps], rel=RTOL)
    # the scheduler dict's StepLR with interval="epoch": lr halves after the first epoch, not per step
    assert [r["train/lr"] for r in steps] == pytest.approx([0.05] * (STEPS // 2) + [0.025] * (STEPS // 2))
    assert set(single["validate"]) == {"val_loss", "val_mae"}
    assert set(single["test"]) == {"test_loss"}
    assert os.path.isfile(os.path.join(single["run_dir"], "hparams.yaml"))


def test_one_process_and_two_ddp_ranks_train_the_same(runs):
    single, ddp = runs["single"], runs["ddp"]
    assert ddp["fit_step"] == single["fit_step"] == STEPS
    one, two = _step_records(single["records"]), _step_records(ddp["records"])
    assert [r["step"] for r in two] == [r["step"] for r in one]
    for name in ("train/loss", "train_loss", "train/lr"):
        assert [r[name] for r in two] == pytest.approx([r[name] for r in one], rel=RTOL), name
    # the validation at the end of fit, as logged
    val_one = [r for r in single["records"] if "val_loss" in r]
    val_two = [r for r in ddp["records"] if "val_loss" in r]
    assert len(val_one) == len(val_two) >= 1
    for a, b in zip(val_one, val_two):
        assert b["val_loss"] == pytest.approx(a["val_loss"], rel=RTOL)
        assert b["val_mae"] == pytest.approx(a["val_mae"], rel=RTOL)


def test_validate_and_test_metrics_equal_on_one_process_and_two_ranks(runs):
    single, ddp = runs["single"], runs["ddp"]
    for stage, names in (("validate", {"val_loss", "val_mae"}), ("test", {"test_loss"})):
        assert set(single[stage]) == set(ddp[stage]) == names, stage
        for name in names:
            assert ddp[stage][name] == pytest.approx(single[stage][name], rel=RTOL), name
    # validate() after fit evaluates the fitted module: the end-of-fit validation's numbers
    assert single["validate"]["val_loss"] == pytest.approx(single["logged_after_fit"]["val_loss"], rel=RTOL)


def test_predictions_equal_each_sample_once_in_dataset_order(runs):
    single, ddp = _predictions(runs["single"]["predict"]), _predictions(runs["ddp"]["predict"])
    assert single.shape == ddp.shape == (PREDICT_SAMPLES, 1)
    torch.testing.assert_close(ddp, single, **TOL)
    x = _predict_inputs()
    for name, got in (("single", single), ("ddp", ddp)):
        module = runs[name]["module"]  # the fitted weights (returned from the spawned workers for ddp)
        with torch.no_grad():
            expected = module.eval()(x)
        torch.testing.assert_close(got, expected, **TOL)


def test_load_from_checkpoint_of_the_ddp_run(runs):
    ddp = runs["ddp"]
    expected = _predictions(ddp["predict"])
    latest = _latest_checkpoint(ddp["run_dir"])
    for path in (latest, os.path.join(ddp["run_dir"], "checkpoints")):  # a checkpoint, or the directory of them
        loaded = LitRegressor.load_from_checkpoint(path)
        assert isinstance(loaded, LitRegressor)
        assert dict(loaded.hparams) == {"hidden": 12, "lr": 0.05, "batch_size": GLOBAL_BATCH // 2}
        assert loaded.hparams.hidden == 12 and loaded.net[0].out_features == 12
        with torch.no_grad():
            torch.testing.assert_close(loaded.eval()(_predict_inputs()), expected, **TOL)
    # an override wins over the saved value: lr does not change the weights' shapes
    assert LitRegressor.load_from_checkpoint(latest, lr=0.2).hparams.lr == 0.2
    # a hidden size the weights do not fit: strict loading refuses it
    with pytest.raises((CheckpointError, RuntimeError), match=r"size mismatch|do not fit"):
        LitRegressor.load_from_checkpoint(latest, hidden=7)


def test_test_with_ckpt_path_last_gives_the_metrics_after_fit(runs, tmp_path):
    for name in ("single", "ddp"):
        run = runs[name]
        expected = run["test"]
        # the same trainer, module=None
        again = run["trainer"].test(ckpt_path="last")
        assert set(again) == set(expected)
        assert again["test_loss"] == pytest.approx(expected["test_loss"], rel=RTOL), name
    # a fresh module (other initial weights) and a fresh one-process trainer reading the ddp run's checkpoints
    torch.manual_seed(1)
    fresh = new_trainer(tmp_path / "fresh", max_steps=-1, max_epochs=EPOCHS,
                        checkpoint=dict(save_last=True, dir=os.path.join(runs["ddp"]["run_dir"], "checkpoints")))
    got = fresh.test(LitRegressor(hidden=12, batch_size=5), ckpt_path="last")
    assert got["test_loss"] == pytest.approx(runs["ddp"]["test"]["test_loss"], rel=RTOL)
    torch.manual_seed(1)
    untrained = new_trainer(tmp_path / "untrained").test(LitRegressor(hidden=12, batch_size=5))
    assert untrained["test_loss"] != pytest.approx(got["test_loss"], rel=1e-3)  # the check can fail


def test_validate_and_test_after_fit_keep_the_fitted_progress(runs):
    # As Lightning: trainer.validate() / test() on the fitted module neither train nor reset the
    # trainer's progress (global_step, current_epoch), and their metrics are logged at the fitted step.
    for name in ("single", "ddp"):
        run = runs[name]
        assert (run["fit_step"], run["fit_epoch"]) == (STEPS, EPOCHS), name
        assert run["step_after_validate"] == (STEPS, EPOCHS), name
        assert run["step_after_test"] == (STEPS, EPOCHS), name
        logged = [r["step"] for r in run["records"] if "val_loss" in r or "test_loss" in r]
        assert logged == [STEPS] * 3, (name, logged)  # fit's final validation, validate(), test()
