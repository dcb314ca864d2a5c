"""``trainer.lightning.cli.LightningCLI``: a program of our own written with Lightning's LightningCLI
(tests/support/lightning_programs/regression_cli.py: a model, a datamodule, a recording callback) run
from its own command line (a config file and overrides) under Lightning and, imports rewritten, here:
the same per-step losses, trained weights and test loss (rel 1e-5; the data order is the loaders' own,
unshuffled), with the model's ``configure_optimizers`` and with ``--optimizer`` / ``--lr_scheduler``.
In this process: ``--print_config`` output loads back, ``run=False``, ``trainer_defaults``,
``seed_everything_default``, class paths written for Lightning, and the errors for a bad flag.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
import yaml

from tests.support.lightning_cli_runs import run_cli, run_fit, run_test, write_config

pytest.importorskip("jsonargparse")
pytestmark = pytest.mark.timeout(900)

RTOL = 1e-5
SIDES = ("lightning", "ours")
SCHEDULED = ("--optimizer=Adam", "--optimizer.lr=0.01", "--lr_scheduler=StepLR", "--lr_scheduler.step_size=1",
             "--lr_scheduler.gamma=0.5")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each side: ``fit`` (config + ``--model.lr``), ``test`` of its weights, ``fit`` with an optimizer
    and a scheduler from the command line."""
    pytest.importorskip("lightning")
    out = {}
    for side in SIDES:
        directory = str(tmp_path_factory.mktemp(side))
        out[side] = {
            "dir": directory,
            "fit": run_fit(side, directory, "fit", "--model.lr=0.05"),
            "test": run_test(side, directory, "tested", "fit"),
            "scheduled": run_fit(side, directory, "scheduled", *SCHEDULED),
        }
    return out


def _same_training(ours: dict, lightning: dict) -> None:
    assert len(ours["train_loss"]) == len(lightning["train_loss"]) == 16  # 2 epochs of 8 batches
    torch.testing.assert_close(torch.tensor(ours["train_loss"]), torch.tensor(lightning["train_loss"]), rtol=RTOL, atol=0)
    for name, value in lightning["weights"].items():
        torch.testing.assert_close(ours["weights"][name], value, rtol=RTOL, atol=1e-7)


def test_fit_from_a_config_file_and_overrides_trains_as_under_lightning(runs):
    _same_training(runs["ours"]["fit"], runs["lightning"]["fit"])


def test_test_after_fit_gives_lightnings_test_loss(runs):
    ours, lightning = runs["ours"]["test"]["test_loss"], runs["lightning"]["test"]["test_loss"]
    assert ours == pytest.approx(lightning, rel=RTOL)
    assert ours != pytest.approx(runs["ours"]["fit"]["train_loss"][0], rel=1e-3)  # (the trained weights were tested)


def test_optimizer_and_lr_scheduler_flags_train_as_under_lightning(runs):
    _same_training(runs["ours"]["scheduled"], runs["lightning"]["scheduled"])
    # the scheduler stepped once per epoch (Lightning's meaning of [optimizer], [scheduler]): not the plain fit
    assert runs["ours"]["scheduled"]["train_loss"] != runs["ours"]["fit"]["train_loss"]


def test_the_saved_config_is_the_run_and_loads_back(runs):
    with open(os.path.join(runs["ours"]["dir"], "fit", "config.yaml")) as f:
        saved = yaml.safe_load(f)
    assert saved["model"]["lr"] == 0.05 and saved["seed_everything"] == 7 and saved["trainer"]["max_epochs"] == 2
    assert [c["class_path"] for c in saved["trainer"]["callbacks"]] == [
        "tests.support.lightning_as_ours.regression_cli.LossRecorder"]
    # the saved file is a config file of the same program: a second fit from it alone trains the same
    directory = runs["ours"]["dir"]
    run_cli("ours", directory, "fit", "--config", os.path.join(directory, "fit", "config.yaml"),
            "--trainer.default_root_dir=again", "--trainer.callbacks.path=again.json")
    with open(os.path.join(directory, "again.json")) as f:
        assert yaml.safe_load(f)["train_loss"] == runs["ours"]["fit"]["train_loss"]


# ----- in this process: parsing, printing, building ----------------------------------------------------------
@pytest.fixture
def program(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["program"])
    from tests.support.lightning_as_ours import regression_cli

    return regression_cli


def _cli(program, *args, **kwargs):
    from trainer.lightning.cli import LightningCLI

    return LightningCLI(program.Regressor, program.RegressionData, args=list(args), **kwargs)


def test_print_config_output_loads_back(program, tmp_path, capsys):
    config = write_config(str(tmp_path))
    with pytest.raises(SystemExit) as stopped:
        _cli(program, "--config", config, "--model.lr=0.3", "--trainer.callbacks+=EarlyStopping",
             "--trainer.callbacks.monitor=val_loss", "--print_config", run=False)
    assert stopped.value.code == 0
    printed = tmp_path / "printed.yaml"
    printed.write_text(capsys.readouterr().out)
    cli = _cli(program, "--config", str(printed), run=False)
    assert cli.model.hparams.lr == 0.3 and cli.datamodule.batch_size == 8
    assert cli.trainer.max_epochs == 2 and cli.trainer.log_every_n_steps == 50  # (Lightning's default)
    from trainer.lightning.callbacks import EarlyStopping

    stops = [c for c in cli.trainer.callbacks if isinstance(c, EarlyStopping)]
    assert len(stops) == 1 and stops[0].monitor == "val_loss"


def test_a_config_written_for_lightning_names_the_mirrors_classes(program, tmp_path):
    # Lightning's class paths (a callback, a logger) in a config file and on the command line
    config = tmp_path / "lightning.yaml"
    config.write_text("trainer:\n  callbacks:\n  - class_path: lightning.pytorch.callbacks.EarlyStopping\n"
                      "    init_args:\n      monitor: val_loss\n      patience: 2\n")
    cli = _cli(program, "--config", str(config), "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
               "--trainer.logger.save_dir=logs", "--trainer.callbacks+=pytorch_lightning.callbacks.LearningRateMonitor",
               run=False)
    from trainer.lightning.callbacks import EarlyStopping, LearningRateMonitor
    from trainer.lightning.loggers import CSVLogger

    assert any(isinstance(c, EarlyStopping) and c.patience == 2 for c in cli.trainer.callbacks)
    assert any(isinstance(c, LearningRateMonitor) for c in cli.trainer.callbacks)
    assert isinstance(cli.trainer.logger, CSVLogger)


def test_run_false_trainer_defaults_and_the_seed(program):
    from trainer.lightning.cli import SaveConfigCallback

    cli = _cli(program, "--trainer.max_epochs=3", run=False, seed_everything_default=123,
               trainer_defaults={"max_epochs": 5, "limit_val_batches": 2, "enable_progress_bar": False})
    assert cli.subcommand is None and cli.config["seed_everything"] == 123 and os.environ["PL_GLOBAL_SEED"] == "123"
    assert cli.trainer.max_epochs == 3 and cli.trainer.limit_val_batches == 2  # the command line, then the defaults
    assert cli.trainer.seed == 123  # the sample order follows seed_everything, as under Lightning
    assert any(isinstance(c, SaveConfigCallback) for c in cli.trainer.callbacks)
    cli = _cli(program, run=False, save_config_callback=None, seed_everything_default=False)
    assert not any(isinstance(c, SaveConfigCallback) for c in cli.trainer.callbacks)


def test_a_subcommand_method_of_the_cli_runs_instead_of_the_trainers(program):
    from trainer.lightning.cli import LightningCLI

    class Recording(LightningCLI):
        def fit(self, **kwargs):
            self.fit_kwargs = kwargs

    cli = Recording(program.Regressor, program.RegressionData, args=["fit", "--ckpt_path=last"])
    assert cli.subcommand == "fit" and cli.fit_kwargs["ckpt_path"] == "last"
    assert cli.fit_kwargs["model"] is cli.model and cli.fit_kwargs["datamodule"] is cli.datamodule


def test_a_lightning_flag_refused_here_and_a_typo_say_what_to_use(program, capsys):
    with pytest.raises(SystemExit):
        _cli(program, "fit", "--trainer.profiler=simple")
    assert "'profiler' (Lightning's) is not a Trainer argument here; use profile=" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _cli(program, "fit", "--trainer.max_epohcs=2")
    assert "did you mean max_epochs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        _cli(program, "fit", "--model.hiden=3")
    assert "hiden" in capsys.readouterr().err


def test_cli_lightning_logo_needs_no_jsonargparse():
    import subprocess

    code = ("import sys; sys.modules['jsonargparse'] = None\n"
            "from trainer.lightning.cli import cli_lightning_logo; cli_lightning_logo()\n"
            "try:\n    from trainer.lightning.cli import LightningCLI\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install 'meshtrainer[cli]'" in out


def test_any_model_by_class_path_and_parser_kwargs(program, tmp_path):
    from trainer.lightning.cli import LightningCLI

    defaults = tmp_path / "defaults.yaml"
    path = "tests.support.lightning_as_ours.regression_cli.Regressor"
    defaults.write_text(f"model:\n  class_path: {path}\n  init_args:\n    hidden: 5\n")
    cli = LightningCLI(None, program.RegressionData, run=False, parser_kwargs={"default_config_files": [str(defaults)]},
                       args=[f"--model={path}", "--model.lr=0.2"])
    assert type(cli.model) is program.Regressor and cli.model.hparams.hidden == 5 and cli.model.hparams.lr == 0.2
    with pytest.raises(SystemExit):  # a class that is not a LightningModule
        LightningCLI(None, program.RegressionData, run=False, args=["--model=torch.nn.Linear"])


def test_an_optimizer_group_linked_to_a_model_argument_and_a_callback_group(program):
    from torch.optim import SGD

    from trainer.lightning.callbacks import EarlyStopping
    from trainer.lightning.cli import LightningCLI

    class Configured(program.Regressor):
        def __init__(self, optimizer: dict | None = None, hidden: int = 8):
            super().__init__(hidden=hidden)
            self.optimizer_init = optimizer

    class LinkingCLI(LightningCLI):
        def add_arguments_to_parser(self, parser):
            parser.add_optimizer_args(SGD, link_to="model.optimizer")
            parser.add_lightning_class_args(EarlyStopping, "early_stopping")
            parser.set_defaults({"early_stopping.monitor": "val_loss"})

    cli = LinkingCLI(Configured, program.RegressionData, run=False,
                     args=["--optimizer.lr=0.3", "--early_stopping.patience=4"])
    assert cli.model.optimizer_init["class_path"] == "torch.optim.sgd.SGD"  # (Lightning's path of one class)
    assert cli.model.optimizer_init["init_args"]["lr"] == 0.3
    assert "configure_optimizers" not in vars(cli.model)  # (linked: the model's own configure_optimizers)
    stops = [c for c in cli.trainer.callbacks if isinstance(c, EarlyStopping)]
    assert len(stops) == 1 and stops[0].patience == 4 and stops[0].monitor == "val_loss"


def test_the_automatic_optimizer_builds_on_the_models_parameters(program):
    with pytest.warns(UserWarning, match="Regressor.configure_optimizers` will be overridden"):  # (as Lightning)
        cli = _cli(program, "--optimizer=Adam", "--optimizer.lr=0.02", "--lr_scheduler=ReduceLROnPlateau",
                   "--lr_scheduler.monitor=val_loss", run=False)
    configured = cli.model.configure_optimizers()
    optimizer, scheduler = configured["optimizer"], configured["lr_scheduler"]
    assert isinstance(optimizer, torch.optim.Adam) and optimizer.param_groups[0]["lr"] == 0.02
    assert optimizer.param_groups[0]["params"] == list(cli.model.parameters())
    assert scheduler["monitor"] == "val_loss" and scheduler["scheduler"].optimizer is optimizer


def test_settings_from_the_environment_with_default_env(program, monkeypatch):
    monkeypatch.setenv("PL_TRAINER__MAX_EPOCHS", "4")
    monkeypatch.setenv("PL_MODEL__HIDDEN", "3")
    cli = _cli(program, run=False, parser_kwargs={"default_env": True})
    assert cli.trainer.max_epochs == 4 and cli.model.hparams.hidden == 3
    assert _cli(program, run=False).trainer.max_epochs is None  # (off by default: Lightning's, 1000 once fit starts)


def test_only_lightning_class_paths_the_mirror_has_are_rewritten():
    from trainer.lightning.cli_parser import mirror_args, mirror_class_path

    assert mirror_class_path("pytorch_lightning.loggers.CSVLogger") == "trainer.lightning.loggers.CSVLogger"
    assert mirror_class_path("lightning.Trainer") == "trainer.lightning.Trainer"
    assert mirror_class_path("lightning.ai") == "lightning.ai"  # (a value that only looks like a path)
    assert mirror_class_path("lightning.pytorch.callbacks.RichProgressBar").startswith("lightning.")  # (not here)
    assert mirror_args(["--model.name=lightning.ai", "--trainer.logger", "CSVLogger", "--model.tag=Timer"]) == [
        "--model.name=lightning.ai", "--trainer.logger", "trainer.lightning.loggers.CSVLogger", "--model.tag=Timer"]
