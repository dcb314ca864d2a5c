"""The ``trainer`` command (``python -m trainer``): the train job as ``train.py`` runs it, the
subcommands, a project's own folder (its conf/ and modules) and ``trainer init``. The installed wheel
is tested in tests/multiprocess/tools/test_wheel.py."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.plugins import Plugins
from hydra.plugins.search_path_plugin import SearchPathPlugin

from tests.support.command_line import FAST, TRAIN, assert_ok, assert_six_steps, assert_same_losses, run
from tests.support.helpers import REPO
from trainer.cli import command
from trainer.cli.init_project import package_name
from trainer.cli.project_dir import ProjectConfigs, use_project_dir
from trainer.runtime import config_dir
from trainer.runtime.config_dir import builtin_config_dir


def test_python_m_trainer_trains_as_train_py_does(tmp_path):
    """The same overrides give the same run: the losses of 6 steps agree exactly (one process, CPU)."""
    runs = {}
    for name, program in (("train.py", TRAIN), ("trainer", [sys.executable, "-m", "trainer"])):
        run_dir = tmp_path / name.replace(".", "_")
        result = run(program + FAST + ["logger=[jsonl]", f"hydra.run.dir={run_dir}"])
        assert_ok(result)
        runs[name] = assert_six_steps(run_dir)
        assert (run_dir / "train.log").is_file()  # Hydra's job is named train under both
    assert_same_losses(runs["trainer"], runs["train.py"], rtol=0.0)


def test_help_lists_every_command_in_a_few_lines(capsys):
    assert command.main(["--help"]) == 0
    printed = capsys.readouterr().out
    assert len(printed.splitlines()) <= 20
    for name in ("estimate", "dry-run", "autotune", "consolidate", "prepare-text", "init"):
        assert f"\n  {name} " in printed


@pytest.mark.parametrize("arg, training", [
    ("recipe=mlp", True), ("+trainer.foo=1", True), ("~logger", True), ("-m", True), ("--config-dir", True),
    ("estimate", False), ("init", False), ("estimat", False),
])
def test_an_override_is_never_a_command_name(arg, training):
    assert command.is_training_argument(arg) is training


def test_an_unknown_command_is_one_line_naming_it_and_the_commands(capsys):
    assert command.main(["estimat", "recipe=mlp"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'estimat'" in err
    assert all(name in err for name in command.COMMANDS)


def test_the_builtin_configs_are_found_and_their_absence_is_one_clear_error(monkeypatch):
    assert (builtin_config_dir() / "config.yaml").is_file()
    assert (builtin_config_dir() / "strategy" / "ddp.yaml").is_file()
    assert builtin_config_dir().resolve() == (Path(REPO) / "conf").resolve()  # the checkout's: one source
    monkeypatch.setattr(config_dir, "CONFIG_PACKAGE", "trainer.no_such_conf")  # installed without the configs
    with pytest.raises(FileNotFoundError, match="no package trainer.no_such_conf"):
        builtin_config_dir()
    runtime = Path(config_dir.__file__).parent
    monkeypatch.setattr(config_dir, "CONFIG_PACKAGE", "trainer.runtime")  # a package, but no config.yaml in it
    with pytest.raises(FileNotFoundError, match=f"no config.yaml in {runtime}"):
        builtin_config_dir()


@pytest.fixture
def project_dir(tmp_path, monkeypatch):
    """``tmp_path`` as the folder the command runs in; the search-path plugin and ``sys.path`` restored after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    use_project_dir()
    yield tmp_path
    Plugins.instance().plugin_type_to_subclass_list[SearchPathPlugin].remove(ProjectConfigs)


def _compose(overrides: list[str]):
    with initialize_config_dir(config_dir=str(builtin_config_dir()), version_base="1.3"):
        return compose("config", overrides=overrides)


def test_a_projects_conf_composes_over_the_builtin_one(project_dir):
    (project_dir / "conf" / "recipe").mkdir(parents=True)
    (project_dir / "conf" / "optimizer").mkdir()
    (project_dir / "conf" / "recipe" / "mine.yaml").write_text(textwrap.dedent("""\
        # @package _global_
        module:
          _target_: mine.Model
        """))
    (project_dir / "conf" / "optimizer" / "sgd.yaml").write_text("_target_: torch.optim.SGD\n_partial_: true\nlr: 0.5\n")
    assert str(project_dir) in sys.path  # the project's modules import by name
    cfg = _compose(["recipe=mine", "optimizer=sgd", "strategy=fsdp"])
    assert cfg.module._target_ == "mine.Model"  # a new option of a built-in group
    assert cfg.optimizer.lr == 0.5  # the project's file wins over the built-in one of the same name
    assert cfg.strategy._target_ == _compose(["strategy=fsdp"]).strategy._target_  # built-in options still there


def test_init_writes_a_project_whose_experiment_builds_its_own_classes(project_dir, capsys):
    target = project_dir / "my-proj"
    assert command.main(["init", str(target)]) == 0
    assert "trainer recipe=my_proj" in capsys.readouterr().out
    files = sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file())
    assert files == ["README.md", "conf/recipe/my_proj.yaml", "my_proj/__init__.py", "my_proj/data.py",
                     "my_proj/module.py", "tests/test_my_proj.py"]
    readme = (target / "README.md").read_text()
    assert "trainer recipe=my_proj\npython -m pytest tests\n" in readme  # its two commands
    os.chdir(target)
    sys.path.insert(0, str(target))  # as use_project_dir does in the project's folder
    from hydra.utils import instantiate

    cfg = _compose(["recipe=my_proj"])
    module, data = instantiate(cfg.module), instantiate(cfg.datamodule)
    assert type(module).__module__ == "my_proj.module" and type(data).__module__ == "my_proj.data"
    assert (cfg.trainer.max_steps, cfg.data.batch_size) == (60, 32)
    # Nothing is overwritten: a second init names what is there.
    assert command.main(["init", str(target)]) == 1
    assert "README.md" in capsys.readouterr().err
    for name in ("my_proj", "my_proj.module", "my_proj.data"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("folder, name", [("my-proj", "my_proj"), ("2024 run", "project_2024_run"),
                                          ("json", "json_project"), ("trainer", "trainer_project")])
def test_the_projects_package_name_is_importable_and_its_own(tmp_path, folder, name):
    assert package_name(tmp_path / folder) == name
    assert name.isidentifier()
