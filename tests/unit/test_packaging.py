"""The distribution's layout in pyproject.toml: every package of ``trainer/`` is listed, the top-level
``conf/`` and ``recipes/`` are mapped into the package (no links in the tree), and the distribution
is ``meshtrainer`` with the ``trainer`` command. The built wheel is tested in
tests/multiprocess/tools/test_wheel.py."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency reads toml
    import tomli as tomllib

from tests.support.helpers import REPO

PYPROJECT = tomllib.loads((Path(REPO) / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def _package_folders() -> set[str]:
    """Dotted names of the folders under trainer/ that hold an ``__init__.py``."""
    root = Path(REPO)
    return {p.parent.relative_to(root).as_posix().replace("/", ".") for p in (root / "trainer").rglob("__init__.py")
            if "__pycache__" not in p.parts}


def test_every_package_folder_is_listed_and_the_mapped_ones_too():
    mapped = SETUPTOOLS["package-dir"]
    assert mapped == {"trainer.conf": "conf", "trainer.recipes": "recipes"}
    # A folder missing from the list would be missing from the wheel, silently.
    assert sorted(SETUPTOOLS["packages"]) == sorted(_package_folders() | set(mapped))
    for package, folder in mapped.items():
        assert (Path(REPO) / folder / "__init__.py").is_file(), package  # regular packages: editable installs find them


def test_the_tree_holds_no_links():
    links = [os.path.join(d, n) for d, dirs, files in os.walk(Path(REPO) / "trainer") for n in dirs + files
             if os.path.islink(os.path.join(d, n))]
    assert links == []


def test_the_mapped_packages_answer_from_their_top_level_folders():
    """What an editable install of this checkout does; a wheel holds the same files at the same names."""
    for package, folder in SETUPTOOLS["package-dir"].items():
        spec = importlib.util.find_spec(package)
        assert spec is not None, f"{package} is not importable: install the checkout (pip install -e .)"
        assert [Path(p).resolve() for p in spec.submodule_search_locations] == [(Path(REPO) / folder).resolve()]
    assert "*/*.yaml" in SETUPTOOLS["package-data"]["trainer.conf"]
    assert not list((Path(REPO) / "conf").glob("*/*/*.yaml"))  # deeper yaml files would be left out of the wheel


def test_the_distribution_is_meshtrainer_and_the_command_trainer():
    assert PYPROJECT["project"]["name"] == "meshtrainer"  # `trainer` on the index is another project
    assert PYPROJECT["project"]["scripts"] == {"trainer": "trainer.cli.command:main"}
