"""Errors at the door, in process: Hydra's composition errors described in one line with the valid
names closest first (``trainer.cli.hydra_errors``), the hook that prints them in place of Hydra's
report (``trainer.cli.errors.hydra_errors_in_one_line``), and the optimizer's and schedule's
settings checked by their own constructors (``trainer.cli.optimizer_check``). The same inputs run
end to end through ``python train.py`` in tests/multiprocess/facade/test_newcomer_errors.py."""

from __future__ import annotations

import os
import sys

import hydra
import hydra._internal.utils as hydra_utils
import pytest
from hydra import compose, initialize_config_dir

from tests.support.helpers import REPO
from trainer.cli.errors import hydra_errors_in_one_line
from trainer.cli.hydra_errors import closest_first, describe, import_target
from trainer.cli.optimizer_check import check_optimizer_settings

CONF_DIR = os.path.join(REPO, "conf")
STRATEGY_KEYS = ("accelerator, find_unused_parameters, static_graph, gradient_as_bucket_view, bucket_cap_mb, "
                 "broadcast_buffers, zero1")
TOP = ("the top-level keys: module, data, objective, checkpoint, trainer, strategy, optimizer, scheduler, precision, "
       "logger; the config groups: callbacks, datamodule, hparams_search, recipe")


def composing(overrides: list[str]) -> str | None:
    """What ``describe`` says about the error composing ``conf/config.yaml`` with ``overrides`` raises."""
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        try:
            compose("config", overrides=["recipe=mlp"] + overrides)
        except Exception as error:
            return describe(error)
    raise AssertionError(f"{overrides} composed without an error")


@pytest.mark.parametrize(
    "overrides, line",
    [
        (["strategy=fdsp"], "strategy=fdsp: there is no strategy option fdsp; did you mean strategy=fsdp? "
                            "(the strategy options are fsdp, ddp, nd, pipeline, single)"),
        (["logger=[jsonl,tensorbard]"], "logger=tensorbard: there is no logger option tensorbard; did you mean "
                                        "logger=tensorboard? (the logger options are tensorboard, csv, jsonl, mlflow, wandb)"),
        (["devices=2"], f"devices=2: there is no top-level key devices; did you mean trainer.devices=2? ({TOP})"),
        (["stratgy=ddp"], f"stratgy=ddp: there is no top-level key stratgy; did you mean strategy=ddp? ({TOP})"),
        (["strategy=ddp", "strategy.sharding=full"],
         "strategy.sharding=full: strategy=ddp has no key sharding (strategy=fsdp has it: select that strategy to "
         f"set it) (the keys of strategy=ddp: {STRATEGY_KEYS})"),
        (["strategy=ddp", "strategy.find_unused=true"],
         "strategy.find_unused=true: strategy=ddp has no key find_unused; did you mean "
         "strategy.find_unused_parameters=true? (the keys of strategy=ddp: find_unused_parameters, accelerator, "
         "static_graph, gradient_as_bucket_view, bucket_cap_mb, broadcast_buffers, zero1)"),
        (["module.hiden=3"], "module.hiden=3: module has no key hiden; did you mean module.hidden=3? (the keys of "
                             "module: hidden, optimizer, scheduler, num_features, num_classes, num_samples, "
                             "val_samples, data_seed)"),
        (["optimizer.nesterov=true"], "optimizer.nesterov=true: optimizer.nesterov is a setting of torch.optim.SGD "
                                      "that this config does not list; add it with +optimizer.nesterov=true"),
        (["trainer.max_steps=[1"], "trainer.max_steps=[1: not a valid override (no viable alternative at input "
                                   "'[1'); did you mean trainer.max_steps=[1]? (an override is name=value, the value "
                                   "a number, a word, 'quoted text', [a,b] or {k:v})"),
        (["~trainer.nothing"], "Could not delete from config. 'trainer.nothing' does not exist."),
        (["logger=jsonl,csv"], "logger=jsonl,csv: a comma-separated value is a sweep, which runs with --multirun "
                               "(-m); for a list write logger=[jsonl,csv], for text logger='jsonl,csv'"),
    ],
)
def test_composition_error_is_one_line_with_the_closest_valid_names(overrides, line):
    assert composing(overrides) == line


def test_mistyped_trainer_key_names_the_closest_first_then_every_key():
    line = composing(["trainer.max_step=10"])
    head = "trainer.max_step=10: trainer has no key max_step; did you mean trainer.max_steps=10? (the keys of trainer: "
    assert line.startswith(head), line
    keys = line[len(head):-1].split(", ")
    assert keys[0] == "max_steps" and {"devices", "seed", "accumulate_grad_batches"} <= set(keys), keys


def test_syntax_error_without_a_likely_fix_still_says_the_form():
    line = composing(["trainer.max_steps"])
    assert line.startswith("trainer.max_steps: not a valid override (missing EQUAL at '<EOF>')"), line
    assert "did you mean" not in line and "an override is name=value" in line


@pytest.mark.parametrize(
    "target, line",
    [
        ("torch.optim.Adamw", "optimizer._target_=torch.optim.Adamw: torch.optim has no Adamw; did you mean "
                              "torch.optim.AdamW or torch.optim.Adam or torch.optim.RAdam?"),
        ("torch.optim.lr_schedulr.StepLR", "optimizer._target_=torch.optim.lr_schedulr.StepLR: torch.optim has no "
                                           "lr_schedulr; did you mean torch.optim.lr_scheduler?"),
        ("no_such_package_here.Thing", "optimizer._target_=no_such_package_here.Thing: there is no module "
                                       "no_such_package_here; give a class or function as package.module.Name"),
    ],
)
def test_target_that_does_not_import_names_the_closest_names_of_its_module(target, line):
    with pytest.raises(ValueError) as error:
        import_target("optimizer", target)
    assert str(error.value) == line


def test_target_that_imports_is_found_as_hydra_finds_it():
    import torch

    assert import_target("optimizer", "torch.optim.SGD") is torch.optim.SGD
    assert import_target("optimizer", "torch.optim.SGD.step") is torch.optim.SGD.step


def test_closest_first_keeps_the_others_in_order():
    assert closest_first("fdsp", ["ddp", "fsdp", "pipeline", "single"]) == ["fsdp", "ddp", "pipeline", "single"]
    assert closest_first("zzz", ["b", "a"]) == ["b", "a"]


def test_errors_that_are_not_hydras_are_left_alone():
    assert describe(ValueError("not ours")) is None


# ----- the hook around @hydra.main ------------------------------------------------------------------------
@hydra.main(config_path=CONF_DIR, config_name="config", version_base="1.3")
def _task(cfg):  # never reached: every override below fails while composing
    raise AssertionError("composed")


@pytest.mark.parametrize("full_error", [False, True])
def test_hook_prints_one_line_and_exits_1_unless_full_error(full_error, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["train.py", "recipe=mlp", "strategy=fdsp"])
    if full_error:
        monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    else:
        monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    original = hydra_utils.run_and_report
    with pytest.raises(BaseException) as ended:
        with hydra_errors_in_one_line():
            _task()
    assert hydra_utils.run_and_report is original  # Hydra's own again afterwards
    err = capsys.readouterr().err
    if full_error:  # Hydra raises its own exception, with its traceback
        assert "Could not find 'strategy/fdsp'" in str(ended.value) and "error: " not in err
    else:
        assert isinstance(ended.value, SystemExit) and ended.value.code == 1
        assert err.splitlines() == ["error: strategy=fdsp: there is no strategy option fdsp; did you mean "
                                    "strategy=fsdp? (the strategy options are fsdp, ddp, nd, pipeline, single)"]


# ----- the optimizer's and the schedule's own checks -------------------------------------------------------
SGD = {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0}
ADAMW = {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}
COSINE = {"_target_": "trainer.optim.schedules.warmup_cosine", "_partial_": True, "warmup_steps": 2,
          "total_steps": 10, "min_lr_ratio": 0.1}


@pytest.mark.parametrize(
    "optimizer, line",
    [
        ({**SGD, "lr": -1}, "optimizer.lr=-1: torch.optim.SGD refuses it (Invalid learning rate: -1); "
                            "the default is lr=0.001"),
        ({**ADAMW, "betas": [0.9, 1.5]}, "optimizer.betas=[0.9,1.5]: torch.optim.AdamW refuses it (Invalid beta "
                                         "parameter at index 1: 1.5); the default is betas=[0.9,0.999]"),
        ({**ADAMW, "weight_decay": -0.1}, "optimizer.weight_decay=-0.1: torch.optim.AdamW refuses it (Invalid "
                                          "weight_decay value: -0.1); the default is weight_decay=0.01"),
        ({**SGD, "momentum": 0.0, "nesterov": True}, "optimizer.nesterov=true: torch.optim.SGD refuses it (Nesterov "
                                                     "momentum requires a momentum and zero dampening); the default "
                                                     "is nesterov=false"),
    ],
)
def test_optimizer_setting_torch_refuses_is_named_before_anything_is_built(optimizer, line):
    # The module's node holds a resolved copy of ${optimizer}: the error names the group's key.
    config = {"module": {"_target_": "trainer.recipes.mlp.MLPClassifier", "optimizer": dict(optimizer)},
              "optimizer": optimizer, "scheduler": None}
    with pytest.raises(ValueError) as error:
        check_optimizer_settings(config)
    assert str(error.value) == line


def test_accepted_settings_pass_and_other_factories_are_not_called():
    config = {"optimizer": ADAMW, "scheduler": COSINE,
              "callbacks": {"x": {"_target_": "builtins.print", "_partial_": True, "sep": -1}}}
    check_optimizer_settings(config)  # no error: print is no optimizer, so never called


def test_schedule_refused_on_the_built_optimizer_names_the_schedule():
    with pytest.raises(ValueError) as error:
        check_optimizer_settings({"optimizer": SGD, "scheduler": {**COSINE, "total_steps": -1}})
    assert str(error.value) == (
        "scheduler: trainer.optim.schedules.warmup_cosine(warmup_steps=2, total_steps=-1, min_lr_ratio=0.1) refuses "
        "these settings (warmup_cosine needs total_steps >= 1, got -1; set trainer.max_steps (or "
        "scheduler.total_steps) when training by epochs)")


def test_optimizer_nested_in_a_module_of_its_own_is_checked_by_its_path():
    config = {"module": {"_target_": "x.Module", "generator_optimizer": {**SGD, "lr": -0.5}}}
    with pytest.raises(ValueError, match=r"^module\.generator_optimizer\.lr=-0\.5: torch\.optim\.SGD refuses it"):
        check_optimizer_settings(config)


@pytest.mark.parametrize(
    "strategy, batch_size, line",
    [
        (dict(microbatches=3), 16, "strategy.microbatches=3 does not divide data.batch_size=16; set "
                                   "strategy.microbatches to one of [2, 4, 8, 16], or data.batch_size to a multiple of 3"),
        (dict(schedule="gpipe"), 7, "strategy.microbatches=null (the 2 stages) does not divide data.batch_size=7; set "
                                    "strategy.microbatches to one of [1, 7], or data.batch_size to a multiple of 2"),
        (dict(stages=4), 2, "strategy.microbatches=null (the 4 stages) does not divide data.batch_size=2; set "
                            "data.batch_size to a multiple of 4"),
    ],
)
def test_pipeline_microbatches_that_do_not_divide_the_batch_are_refused_by_the_trainer(strategy, batch_size, line):
    from trainer import Trainer
    from trainer.strategies.pipeline import PipelineStrategy

    with pytest.raises(ValueError) as error:
        Trainer(strategy=PipelineStrategy(**strategy), devices=strategy.get("stages", 2), batch_size=batch_size,
                max_steps=1, logger=False)
    assert str(error.value) == line


@pytest.mark.parametrize("seed", [1.5, "abc", True])
def test_seed_that_is_no_integer_is_refused_naming_it(seed):
    from trainer import Trainer

    with pytest.raises(ValueError) as error:
        Trainer(seed=seed, logger=False)
    assert str(error.value) == f"trainer.seed={seed!r} must be an integer"


def test_missing_file_raised_while_building_the_module_is_one_line(monkeypatch, capsys):
    # What hydra.utils.instantiate raises when a recipe's module finds no data.tokens directory.
    from hydra.errors import InstantiationException

    from trainer.cli.errors import config_errors

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    missing = NotADirectoryError("data.tokens='nope' is not a directory; make one with prepare_text INPUT... DIR")
    with pytest.raises(SystemExit) as ended:
        with config_errors():
            raise InstantiationException("Error in call to target 'GPTModule':\nNotADirectoryError(...)") from missing
    assert ended.value.code == 1
    assert capsys.readouterr().err.splitlines() == [f"error: {missing}"]
