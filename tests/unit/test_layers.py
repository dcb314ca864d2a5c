"""The package layers: the import contract holds (and only the top layer imports the recipes), fails on
an inverted import, and the loop's run state stays inside trainer/loop (callbacks, checkpoints and tools
get public types)."""

from __future__ import annotations

import ast
import glob
import importlib
import inspect
import os
import shutil
import subprocess
import sys
import typing

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency reads toml
    import tomli as tomllib

import trainer
from trainer.api.callback import Callback
from trainer.api.run_view import RunView
from trainer.loop.rank_run import RankRun

REPO = os.path.dirname(os.path.dirname(os.path.abspath(trainer.__file__)))
LINT_IMPORTS = shutil.which("lint-imports") or os.path.join(os.path.dirname(sys.executable), "lint-imports")


def _lint(cwd: str, pythonpath: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=pythonpath)
    return subprocess.run([LINT_IMPORTS, "--config", os.path.join(cwd, "pyproject.toml"), "--no-cache"], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=120)


def test_the_import_contract_holds():
    done = _lint(REPO, REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 kept, 0 broken" in done.stdout


def _top_layer() -> set[str]:
    """The packages of the contract's first (top) layer, without the parentheses of an optional one."""
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        (contract,) = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    return {name.strip().strip("()") for name in contract["layers"][0].split(":")}


def _importers_of(target: str, package_dir: str) -> list[str]:
    """Files under ``package_dir`` with an import of ``target`` or of a module inside it, anywhere in the file."""
    parent, _, child = target.rpartition(".")
    found = []
    for path in sorted(glob.glob(os.path.join(package_dir, "**", "*.py"), recursive=True)):
        with open(path) as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + ([f"{parent}.{child}"] if node.module == parent and any(
                    alias.name == child for alias in node.names) else [])
            else:
                continue
            if any(name == target or name.startswith(target + ".") for name in names):
                found.append(path)
                break
    return found


def test_only_the_top_layer_imports_the_recipes():
    """The contract cannot see trainer.recipes (the build maps the top-level recipes/ into the package):
    the rule it would check, that no layer below the top one imports the recipes, is checked here."""
    top = _top_layer()
    assert "trainer.recipes" in top and "trainer.cli" in top
    importers = _importers_of("trainer.recipes", os.path.join(REPO, "trainer"))
    assert importers  # the scan sees the command's import of the text preparation
    modules = [os.path.relpath(path, REPO)[:-3].replace(os.sep, ".") for path in importers]
    below = [m for m in modules if not any(m == t or m.startswith(t + ".") for t in top)]
    assert below == [], below


def test_the_recipes_scan_finds_an_import_below_the_top_layer(tmp_path):
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "late.py").write_text("def f():\n    from trainer import recipes  # noqa\n")
    (tmp_path / "runtime" / "plain.py").write_text("import trainer.recipe_book  # noqa\n")
    assert _importers_of("trainer.recipes", str(tmp_path)) == [str(tmp_path / "runtime" / "late.py")]


@pytest.mark.parametrize("where", ["top", "function", "type_checking"])
def test_an_inverted_import_breaks_the_contract(tmp_path, where):
    # A copy of the package with one import from the bottom layer (runtime) up to the loop, placed
    # where late imports hide: at the top, inside a function, under TYPE_CHECKING.
    shutil.copytree(os.path.join(REPO, "trainer"), tmp_path / "trainer", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(os.path.join(REPO, "pyproject.toml"), tmp_path / "pyproject.toml")
    inverted = {
        "top": "from trainer.loop import rank_run  # noqa\n",
        "function": "def _late():\n    from trainer.loop import rank_run  # noqa\n",
        "type_checking": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trainer.loop import rank_run  # noqa\n",
    }[where]
    with open(tmp_path / "trainer" / "runtime" / "seeding.py", "a") as f:
        f.write("\n" + inverted)
    done = _lint(str(tmp_path), str(tmp_path))
    assert done.returncode != 0, done.stdout
    assert "trainer.runtime.seeding -> trainer.loop.rank_run" in done.stdout, done.stdout


def _public(kind: typing.Any) -> bool:
    """A type a user may name: not private, not the loop's."""
    for part in typing.get_args(kind) or (kind,):
        if part is type(None) or part is typing.Any or isinstance(part, str):
            continue
        origin = typing.get_origin(part) or part
        module = getattr(origin, "__module__", "")
        if getattr(origin, "__name__", "_").startswith("_") or module.startswith("trainer.loop") or "._" in module:
            return False
        if typing.get_args(part) and not _public(part):
            return False
    return True


def test_callback_hooks_take_public_types():
    from trainer.api.module import TrainModule
    from trainer.trainer import Trainer

    hooks = [name for name, member in inspect.getmembers(Callback, inspect.isfunction) if name.startswith("on_")]
    assert len(hooks) >= 12
    namespace = {"Trainer": Trainer, "TrainModule": TrainModule, "RunView": RunView}
    for name in hooks:
        hints = typing.get_type_hints(getattr(Callback, name), globalns=vars(sys.modules[Callback.__module__]),
                                      localns=namespace)
        params = list(inspect.signature(getattr(Callback, name)).parameters)[1:]
        assert params[:2] == ["trainer", "module"], (name, params)
        assert hints["trainer"] is Trainer and hints["module"] is TrainModule, (name, hints)
        for param in params:
            assert _public(hints[param]), (name, param, hints[param])
    run_of = importlib.import_module("trainer.callbacks").run_of
    assert typing.get_type_hints(run_of, localns=namespace)["return"] is RunView


class _Watch(Callback):
    """Records the types every hook receives."""

    def __init__(self):
        self.seen: set[tuple[str, str]] = set()

    def __getattribute__(self, name):
        attribute = object.__getattribute__(self, name)
        if not name.startswith("on_"):
            return attribute

        def hook(*args):
            seen = object.__getattribute__(self, "seen")
            for value in args:
                seen.add((name, f"{type(value).__module__}.{type(value).__qualname__}"))
            return attribute(*args)

        return hook

    def on_train_step_end(self, trainer, module, step, metrics):
        from trainer.callbacks import run_of

        view = run_of(trainer)
        assert isinstance(view, RunView) and view.step == step
        with pytest.raises(AttributeError, match="read-only"):
            view.step = 0  # type: ignore[misc]


def test_no_function_outside_the_loop_receives_the_run(tmp_path):
    """Every Python call during a fit (validation, checkpoints, a callback) into code outside
    trainer/loop: no argument is the loop's run; callbacks see only public types."""
    from tests.support.helpers import Regressor, new_trainer

    loop_dir = os.path.join(os.path.dirname(trainer.__file__), "loop") + os.sep
    package_dir = os.path.dirname(trainer.__file__) + os.sep
    view_file = inspect.getsourcefile(RunView)
    leaks: list[str] = []
    calls = [0]

    def profile(frame, event, arg):
        if event != "call":
            return
        filename = frame.f_code.co_filename
        if not filename.startswith(package_dir) or filename.startswith(loop_dir) or filename == view_file:
            return  # (the view wraps the run: the one window on it)
        calls[0] += 1
        code = frame.f_code
        for name in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
            if isinstance(frame.f_locals.get(name), RankRun):
                leaks.append(f"{os.path.relpath(filename, package_dir)}:{code.co_name}({name})")

    watch = _Watch()
    fit = new_trainer(tmp_path, max_steps=4, val_every_n_steps=2, callbacks=[watch], checkpoint={"every_n_steps": 2})
    sys.setprofile(profile)
    try:
        fit.fit(Regressor())
    finally:
        sys.setprofile(None)
    assert calls[0] > 1000  # the profile saw the run's calls
    assert not leaks, sorted(set(leaks))
    kinds = {kind for _, kind in watch.seen}
    assert {"trainer.trainer.Trainer", "tests.support.helpers.Regressor"} <= kinds
    assert not [k for k in kinds if k.startswith("trainer.loop") or "._" in k], kinds
