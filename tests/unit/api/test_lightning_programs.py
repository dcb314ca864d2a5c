"""Programs of our own in Lightning's idioms (tests/support/lightning_programs/) run under Lightning
itself, the oracle, and under this trainer with only their import lines rewritten
(``trainer.lightning``): the same hook calls in the same order (a tracing callback and traced module /
DataModule hooks, tests/support/lightning_trace.py), and on one process with shuffling off the same losses,
logged metrics, results and final parameters (rtol 1e-5).

The first tests check the programs under Lightning (they are the reference: each does what its
docstring says). Each program runs once per side; every test reads the shared runs.
"""

from __future__ import annotations

import os

import pytest

from tests.support.lightning_oracle import (
    PROGRAMS, ProgramRun, assert_same_calls, assert_same_numbers, assert_same_values, compared_calls,
)
from tests.support.lightning_trace import FRAMEWORK_MARK, close
from tests.support.program_runs import ProgramRuns

pytestmark = pytest.mark.timeout(300)

RTOL = 1e-5
HOOK_SEQUENCES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                              "support", "lightning_hook_sequences")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return ProgramRuns(tmp_path_factory.mktemp("lightning_programs"))


def _calls(run: ProgramRun, role: str | None = None, hook: str | None = None) -> list[dict]:
    """The arguments of each call of ``hook`` by ``role`` (defined by the program or not)."""
    return [arguments for r, h, arguments in run.calls
            if (role is None or r.rstrip(FRAMEWORK_MARK) == role) and (hook is None or h == hook)]


def _values(run: ProgramRun, hook: str) -> list[dict[str, float]]:
    return [values for h, values in run.values if h == hook]


# ----- the programs under Lightning: the reference does what the programs say ---------------------------
@pytest.mark.parametrize("name", PROGRAMS)
def test_lightning_hook_sequence_fixtures_are_lightnings_own(runs, name):
    # tests/support/lightning_hook_sequences/<program>.txt: the calls under the installed Lightning, one a
    # line (the classifier: fit / validate / test / predict, 2 epochs of 2 batches, 2 validation batches,
    # 2 sanity steps), to read beside a failing comparison
    with open(os.path.join(HOOK_SEQUENCES, name + ".txt")) as f:
        assert runs.get(name, "lightning").hook_sequence() == f.read()


def test_classifier_tracks_the_best_epoch_accuracy_and_resets_its_metrics(runs):
    run = runs.get("classifier_metrics", "lightning")
    ends = _values(run, "on_validation_end")  # sanity check, 2 epochs, validate()
    assert len(ends) == 4
    epoch_accuracies = [values["val/acc"] for values in ends[1:3]]
    assert epoch_accuracies[0] != epoch_accuracies[1]  # each epoch's own accuracy (reset after compute)
    assert ends[2]["val/acc_best"] == max(epoch_accuracies)
    assert set(run.results["test"][0]) == {"test/loss", "test/acc"}
    assert len(_calls(run, "module", "training_step")) == 4
    assert len(_calls(run, "module", "validation_step")) == 2 + 2 * 2 + 2  # sanity, 2 epochs, validate()


def test_datamodule_divides_the_global_batch_and_restores_its_state(runs):
    run = runs.get("datamodule_world", "lightning")
    local = run.results["process_local"]
    assert local["batch_size_per_device"] == 8
    assert [str(stage.value) for stage in local["stages_set_up"]] == ["fit", "test", "predict"]
    assert [str(stage.value) for stage in local["stages_torn_down"]] == ["fit", "test", "predict"]
    assert local["restored_state"] == {"setups": 1, "batch_size_per_device": 8}  # test(ckpt_path="last")
    assert len(_calls(run, "datamodule", "prepare_data")) == 3  # fit, test, predict
    assert _calls(run, "datamodule", "load_state_dict") == [{}]
    assert _calls(run, "module", "predict_step") == [{}]  # called without batch_idx
    assert run.results["last_checkpoint"] == "last.ckpt"


def test_monitored_checkpoint_early_stopping_and_plateau_scheduler(runs):
    run = runs.get("checkpoint_plateau", "lightning")
    assert run.results["epochs_run"] == 3  # EarlyStopping ended a 6-epoch run
    val_losses = [values["val_loss"] for values in _values(run, "on_validation_end")[1:]]
    assert len(val_losses) == 3
    best_epoch = min(range(3), key=val_losses.__getitem__)
    assert run.results["best_file"] == f"best-epoch={best_epoch}.ckpt"
    assert close(float(run.results["best_score"]), val_losses[best_epoch], RTOL)
    lrs = [values["lr"] for values in _values(run, "on_train_batch_end")]
    # the module's warm-up over two steps, then epoch 1 did not improve by 1.0: halved once
    assert lrs == pytest.approx([0.1, 0.2, 0.2, 0.2, 0.1, 0.1])
    assert _calls(run, "module", "optimizer_step")[:2] == [{"epoch": 0, "batch_idx": 0}, {"epoch": 0, "batch_idx": 1}]
    assert run.results["test_best"][0]["test_loss"] > 0


def test_partial_optimizer_and_network_come_back_from_the_checkpoint(runs):
    run = runs.get("partial_optimizer", "lightning")
    assert run.results["checkpoint_file"] == "/checkpoints/epoch=1-step=4.ckpt"  # Lightning's default checkpoint
    assert run.results["restored_optimizer"] == {"type": "partial", "func": "AdamW",
                                                 "keywords": {"lr": 0.02, "weight_decay": 0.01}}
    assert run.results["restored_net_type"] == "Backbone" and run.results["restored_net_is_net"]
    model = {k: v for k, v in run.numbers.items() if k.startswith("model.")}
    restored = {k.replace("restored.", "model.", 1): v for k, v in run.numbers.items() if k.startswith("restored.")}
    assert_same_numbers(ProgramRun([], [], {}, model), ProgramRun([], [], {}, restored), rtol=0, atol=0)


def test_manual_gan_steps_both_optimizers_and_skips_validation(runs):
    run = runs.get("manual_gan", "lightning")
    assert _calls(run, "module", "training_step") == [{}] * 4  # no batch_idx in its signature
    assert len(_calls(run, "module", "backward")) == 8  # two manual_backward calls a step
    assert len(_calls(run, "callback", "on_before_optimizer_step")) == 8
    assert not _calls(run, "module", "optimizer_step")  # manual optimization: the module steps itself
    assert not [hook for _, hook, _ in run.calls if "validation" in hook]  # no validation_step: no validation
    assert len(_values(run, "on_train_batch_end")) == 4
    assert "sample_radius" in _values(run, "on_fit_end")[0]


def test_the_comparisons_can_fail(runs):
    run = runs.get("classifier_metrics", "lightning")
    assert_same_calls(run, run)
    assert_same_values(run, run, RTOL)
    compared = compared_calls(run)
    assert 100 < len(compared) < len(run.calls)  # the defaults the program does not override are left out
    dropped = ProgramRun(calls=compared[:40] + compared[41:], values=run.values, results={}, numbers={})
    with pytest.raises(AssertionError, match="hook sequences differ at call 40"):
        assert_same_calls(run, dropped)
    assert_same_calls(run, dropped, ignore=(compared[40][1],))
    hook, values = run.values[-1]
    moved = ProgramRun(calls=[], results={}, numbers={},
                       values=run.values[:-1] + [(hook, {k: v * (1 + 1e-4) for k, v in values.items()})])
    with pytest.raises(AssertionError, match="test/loss"):
        assert_same_values(run, moved, RTOL)
    more = ProgramRun(calls=[], results={}, numbers={}, values=run.values[:-1] + [(hook, {**values, "x": 1.0})])
    assert_same_values(run, more, RTOL, extra_names=True)
    with pytest.raises(AssertionError, match="names"):
        assert_same_values(run, more, RTOL)
    with pytest.raises(AssertionError, match="names"):  # a name of Lightning's missing: never allowed
        assert_same_values(more, run, RTOL, extra_names=True)


# ----- the same programs under this trainer, imports rewritten ----------------------------------------------
#: where the loader hooks run differs by design: here at set-up, before the model is wrapped (the
#: global-batch plan needs the data first); Lightning calls them lazily, after on_fit_start
DATA_HOOKS = ("train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader")


@pytest.mark.parametrize("name", PROGRAMS)
def test_same_hook_calls_as_lightning(runs, name):
    assert_same_calls(runs.get(name, "lightning"), runs.get(name, "ours"), ignore=DATA_HOOKS)


CHECKPOINT_NAMES = ("last_checkpoint", "best_file", "checkpoint_file")


@pytest.mark.parametrize("name", PROGRAMS)
def test_same_losses_metrics_and_weights_as_lightning(runs, name):
    lightning, ours = runs.get(name, "lightning"), runs.get(name, "ours")
    # every name the program logs, with Lightning's value; the trainer's own reports may sit beside them
    assert_same_values(lightning, ours, RTOL, extra_names=True)
    # checkpoint names differ by design: a directory per step here (step-000000004), files there (last.ckpt)
    assert_same_numbers(lightning, ours, RTOL, extra=("fit/",), skip=CHECKPOINT_NAMES)
