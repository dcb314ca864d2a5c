"""The wheel is the product: built from this checkout, installed into a fresh virtual environment
outside it, and used there as a new user would, from a folder of their own.

The environment gets the wheel alone (``--no-deps``); its dependencies (torch, hydra, ...) come
from the running interpreter's site-packages through a ``.pth`` line, which adds that folder but runs
none of its own ``.pth`` files: this checkout's editable install stays invisible, and every test
checks that ``trainer`` is imported from the new environment.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.support.helpers import REPO

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency reads toml
    import tomli as tomllib

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

TIMEOUT_S = 240  # per command
#: what the wheel is built from: the repository's files that pyproject.toml packs
SOURCES = ("pyproject.toml", "README.md", "trainer", "conf", "recipes", "hydra_plugins")
#: the distribution's name (`trainer` on the package index is another project's); it installs the package trainer
DISTRIBUTION = "meshtrainer"
PYPROJECT = tomllib.loads((Path(REPO) / "pyproject.toml").read_text())


class Venv:
    """A fresh virtual environment with the wheel installed, and a working folder outside the checkout."""

    def __init__(self, root: Path):
        self.root = root
        self.python = root / "venv" / "bin" / "python"
        self.trainer = root / "venv" / "bin" / "trainer"
        self.work = root / "work"
        self.work.mkdir()

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "HYDRA_FULL_ERROR")}
        env["PATH"] = f"{self.python.parent}{os.pathsep}{env.get('PATH', '')}"  # as after `source venv/bin/activate`
        return env

    def run(self, args: list[str], cwd: Path | None = None, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
        done = subprocess.run(args, cwd=cwd or self.work, env=self.env(), capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"$ {' '.join(map(str, args))}\nexit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        return done


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Venv:
    root = tmp_path_factory.mktemp("wheel")
    # Built from a copy: an in-tree build would leave build/ and *.egg-info in the checkout (and an
    # old build/ could add stale files to the wheel). The build maps the copy's conf/ and recipes/
    # into the package (pyproject's package-dir).
    source = root / "source"
    source.mkdir()
    for name in SOURCES:
        path = Path(REPO) / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(root / "dist"), f"{source}/"], check=True, capture_output=True, timeout=TIMEOUT_S)
    (wheel,) = (root / "dist").glob(f"{DISTRIBUTION}-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=TIMEOUT_S)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(root / "venv" / "bin" / "python"), "install",
                    "--no-deps", "-q", str(wheel)], check=True, capture_output=True, timeout=TIMEOUT_S)
    site = subprocess.run([str(root / "venv" / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return Venv(root)


def _files(package: Path) -> set[str]:
    return {p.relative_to(package).as_posix() for p in package.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


def _checkout_files() -> set[str]:
    """The package's files as the build maps them: trainer/'s, and each package-dir folder's under
    its package's name (conf/ as conf/, recipes/ as recipes/)."""
    mapped = PYPROJECT["tool"]["setuptools"]["package-dir"]
    files = _files(Path(REPO) / "trainer")
    for package, folder in mapped.items():
        files |= {f"{package.split('.', 1)[1].replace('.', '/')}/{name}" for name in _files(Path(REPO) / folder)}
    return files


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _losses(run_dir: Path) -> list[float]:
    return [r["train/loss"] for r in _metrics(run_dir) if "train/loss" in r]


def test_the_installed_package_is_the_one_imported_and_holds_everything(venv):
    done = venv.run([str(venv.python), "-c", "import trainer, trainer.recipes.mlp; "
                     "from importlib import metadata; from trainer.runtime.config_dir import builtin_config_dir as d; "
                     "print(trainer.__file__); print(d()); print(trainer.recipes.mlp.__file__); "
                     f"wheel = metadata.distribution({DISTRIBUTION!r}); "
                     "print(wheel.locate_file('trainer/__init__.py')); print(wheel.version)"])
    module_file, conf, recipe_file, distributed_file, version = done.stdout.split()
    package = Path(module_file).parent
    assert Path(module_file).is_relative_to(venv.root / "venv"), module_file
    assert Path(conf) == package / "conf" and Path(recipe_file) == package / "recipes" / "mlp.py"
    # The import package trainer is the distribution meshtrainer's.
    assert Path(distributed_file) == Path(module_file) and version == PYPROJECT["project"]["version"]
    # Every file of the package in the checkout (the top-level conf/ and recipes/ at their mapped names) is installed.
    assert _files(package) == _checkout_files()
    groups = [sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name != "__pycache__")
              for folder in (Path(conf), Path(REPO) / "conf")]
    assert groups[0] == groups[1] and "strategy" in groups[0]  # every config group
    assert not Path(conf).is_symlink()  # the files themselves, not a link back into the checkout
    assert "estimate" in venv.run([str(venv.trainer), "--help"]).stdout
    # The Hydra plugins land in the hydra_plugins namespace, where Hydra's own scan finds them.
    plugins = venv.run([str(venv.python), "-c", "from hydra.core.plugins import Plugins; "
                        "print(sorted(Plugins.instance().class_name_to_class))"]).stdout
    assert "hydra_plugins.meshtrainer_sweeper.OptunaSweeper" in plugins, plugins


def test_init_then_the_projects_two_commands(venv):
    venv.run([str(venv.trainer), "init", "my_proj"])
    project = venv.work / "my_proj"
    readme = (project / "README.md").read_text()
    commands = re.search(r"```bash\n(.*?)```", readme, re.S).group(1).strip().splitlines()
    assert commands == ["trainer recipe=my_proj", "python -m pytest tests"]
    # As written in the README (the environment's bin/ is first on PATH, as once activated); no PYTHONPATH.
    trained = venv.run(["bash", "-c", commands[0] + " logger=[jsonl]"], cwd=project)
    (run_dir,) = [p.parent for p in (project / "outputs").rglob("metrics.jsonl")]
    losses = _losses(run_dir)
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses
    validation = [r for r in _metrics(run_dir) if "val/accuracy" in r]
    assert validation[-1]["step"] == 60 and validation[-1]["val/accuracy"] > 0.8, validation
    assert (run_dir / "checkpoints").is_dir() and "step 60/60" in trained.stderr + trained.stdout
    tested = venv.run(["bash", "-c", commands[1] + " -p no:cacheprovider -q"], cwd=project)
    assert "2 passed" in tested.stdout
    # The project's module on 2 FSDP workers, which import it with no PYTHONPATH (the console script
    # puts the folder on sys.path; the workers start with it), for the first 10 steps: the same
    # global batch (the experiment's data.global_batch_size), so the same loss as on one process
    # (1e-5: CPU fp32, the gradient's sums in another order).
    sharded = venv.run([str(venv.trainer), "recipe=my_proj", "strategy=fsdp", "trainer.devices=2", "trainer.max_steps=10",
                        "trainer.val_every_n_steps=null", "logger=[jsonl]", f"hydra.run.dir={venv.work / 'project_fsdp'}"],
                       cwd=project)
    assert "strategy fsdp, world size 2" in sharded.stdout + sharded.stderr
    assert _losses(venv.work / "project_fsdp") == pytest.approx(losses[:1], rel=1e-5)


_PYTHON_API = """
import functools, json, sys
import torch
import trainer
from trainer import Trainer
from trainer.recipes.mlp import MLPClassifier

if __name__ == "__main__":  # the workers import this file: only the launching process trains
    assert trainer.__file__.startswith(sys.prefix), trainer.__file__
    strategy, devices, batch_size, run_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    fit = Trainer(strategy=strategy, devices=devices, max_steps=4, batch_size=batch_size, log_every_n_steps=1,
                  run_dir=run_dir, loggers=["jsonl"], enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False)
    trainer.seed_everything(0)  # the same initial weights in every run
    module = MLPClassifier(optimizer=functools.partial(torch.optim.SGD, lr=0.1), num_samples=256, val_samples=0)
    fit.fit(module)
    print(json.dumps([x for p in module.parameters() for x in p.detach().flatten().tolist()]))
"""


def test_the_python_api_with_ddp_and_fsdp_on_two_processes(venv):
    """``Trainer(strategy="ddp" / "fsdp", devices=2)`` from a user's script train as one process does
    on the same global batch (32 = 16 x 2): losses and final weights within 1e-5 (CPU fp32; the
    reductions sum in another order)."""
    (venv.work / "fit.py").write_text(_PYTHON_API)
    results = {}
    for strategy, devices, batch in (("single", 1, 32), ("ddp", 2, 16), ("fsdp", 2, 16)):
        run_dir = venv.work / f"api_{strategy}"
        done = venv.run([str(venv.python), "fit.py", strategy, str(devices), str(batch), str(run_dir)])
        results[strategy] = (_losses(run_dir), json.loads(done.stdout.strip().splitlines()[-1]))
    single_losses, single_weights = results["single"]
    assert len(single_losses) == 4 and all(math.isfinite(x) for x in single_losses)
    for strategy in ("ddp", "fsdp"):
        losses, weights = results[strategy]
        assert losses == pytest.approx(single_losses, rel=1e-5), strategy
        assert len(weights) == len(single_weights) > 1000
        assert weights == pytest.approx(single_weights, rel=1e-5, abs=1e-6), strategy


def test_python_m_trainer_with_ddp_on_two_processes(venv):
    run_dir = venv.work / "cli_ddp"
    done = venv.run([str(venv.python), "-m", "trainer", "recipe=mlp", "strategy=ddp", "trainer.devices=2",
                     "trainer.max_steps=4", "trainer.log_every_n_steps=1", "trainer.val_every_n_steps=null",
                     "logger=[jsonl]", f"hydra.run.dir={run_dir}"])
    assert "strategy ddp, world size 2" in done.stdout + done.stderr
    losses = _losses(run_dir)
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    assert (run_dir / ".hydra" / "config.yaml").is_file() and (run_dir / "checkpoints").is_dir()


def test_estimate_and_autotune(venv):
    estimate = venv.run([str(venv.trainer), "estimate", "recipe=mlp", "trainer.devices=2"]).stdout
    assert re.search(r"^ddp\b", estimate, re.M) and re.search(r"^fsdp full\b", estimate, re.M), estimate
    # One candidate (ddp, micro-batch 32, no activation checkpointing), a few steps, a tiny budget.
    tuned = venv.run([str(venv.trainer), "autotune", "recipe=mlp", "trainer.devices=2", "autotune.budget_s=120",
                      "autotune.steps=2", "autotune.warmup_steps=1", "autotune.strategies=[ddp]",
                      "autotune.micro_batch_sizes=[32]", "autotune.activation_checkpointing=[false]",
                      "trainer.val_every_n_steps=null"])
    (out_dir,) = (venv.work / "outputs" / "autotune").iterdir()
    results = json.loads((out_dir / "results.json").read_text())
    assert [r["status"] for r in results] == ["ok"] and results[0]["samples_per_s"] > 0, results
    assert (out_dir / "best.yaml").is_file() and "run it with: python -m trainer --config-path" in tuned.stdout
