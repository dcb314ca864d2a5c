"""The distribution's layout in pyproject.toml: every package of ``trainer/`` is listed, the top-level
``conf/`` and ``recipes/`` are mapped into the package (no links in the tree), and the distribution
is ``meshtrainer`` with the ``trainer`` command; the Hydra plugins ship as ``hydra_plugins.meshtrainer_sweeper``. The built wheel is tested in
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


def _folders(root: Path, package: str) -> set[str]:
    """Dotted names (``root`` as ``package``) of the folders under ``root`` with files in them or below them,
    data-only ones too."""
    files = [p.relative_to(root) for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    return {".".join((package, *folder.parts)) for path in files for folder in path.parents}


def test_every_folder_is_a_listed_package_and_the_mapped_ones_too():
    mapped = SETUPTOOLS["package-dir"]
    assert mapped == {"trainer.conf": "conf", "trainer.recipes": "recipes"}
    expected = _folders(Path(REPO) / "trainer", "trainer")
    for package, folder in mapped.items():
        assert (Path(REPO) / folder / "__init__.py").is_file(), package  # regular packages: editable installs find them
        expected |= _folders(Path(REPO) / folder, package)
    # The Hydra plugins: a package of the hydra_plugins namespace (no __init__.py there: other distributions share it).
    assert not (Path(REPO) / "hydra_plugins" / "__init__.py").exists()
    expected |= _folders(Path(REPO) / "hydra_plugins" / "meshtrainer_sweeper", "hydra_plugins.meshtrainer_sweeper")
    # A folder missing from the list would be missing from the wheel, silently.
    assert sorted(SETUPTOOLS["packages"]) == sorted(expected)


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


def test_the_distribution_is_meshtrainer_and_the_command_trainer():
    assert PYPROJECT["project"]["name"] == "meshtrainer"  # `trainer` on the index is another project
    assert PYPROJECT["project"]["scripts"] == {"trainer": "trainer.cli.command:main"}
