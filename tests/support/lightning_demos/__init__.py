"""Lightning's own demo modules, read from the installed ``lightning`` package and ported the way a
user ports a program: their import lines rewritten, nothing else changed.

``tests.support.lightning_demos.<demo>`` (``boring_classes``, ``lstm``, ``mnist_datamodule``,
``transformer``) is ``lightning/pytorch/demos/<demo>.py`` as installed, with ``lightning.pytorch``,
``pytorch_lightning`` and ``lightning`` in its import lines replaced by ``trainer.lightning`` (and one
demo's import of another by this package), loaded from memory by an import hook this package
installs. Spawned ranks unpickle the demos' classes by that name and so load them the same way.
No Lightning source is stored in this repository.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import re
import sys
from typing import Any

DEMOS = ("boring_classes", "lstm", "mnist_datamodule", "transformer")

_PACKAGE = __name__
#: a module path in an import line: lightning's, not a longer name (lightning_utilities) or a suffix
_LIGHTNING_PATH = re.compile(r"(?<![\w.])(lightning\.pytorch|pytorch_lightning|lightning)(?![\w])")
_IMPORT_LINE = re.compile(r"^\s*(from\s+\S+\s+import\b|import\s+\S)")


def lightning_root() -> str | None:
    """The installed ``lightning`` package's directory (not imported), or None when it is not installed."""
    spec = importlib.util.find_spec("lightning")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def demo_path(demo: str) -> str:
    root = lightning_root()
    if root is None:
        raise ImportError("the lightning package is not installed (pip install lightning): its demos are read from it")
    return os.path.join(root, "pytorch", "demos", f"{demo}.py")


def rewrite_import_line(line: str) -> str:
    """One import line of a Lightning program as ported: the demos' own package becomes this one,
    every other Lightning path ``trainer.lightning``."""
    line = line.replace("lightning.pytorch.demos.", f"{_PACKAGE}.")
    return _LIGHTNING_PATH.sub("trainer.lightning", line)


def ported_source(demo: str) -> str:
    """The installed demo's source with its import lines rewritten (and only those)."""
    with open(demo_path(demo), encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    return "".join(rewrite_import_line(line) if _IMPORT_LINE.match(line) else line for line in lines)


class _DemoLoader(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``tests.support.lightning_demos.<demo>`` and runs the ported source as that module."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        package, _, demo = fullname.rpartition(".")
        if package != _PACKAGE or demo not in DEMOS:
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=demo_path(demo))

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        demo = module.__name__.rpartition(".")[2]
        module.__file__ = demo_path(demo)
        exec(compile(ported_source(demo), module.__file__, "exec"), module.__dict__)


if not any(isinstance(finder, _DemoLoader) for finder in sys.meta_path):
    sys.meta_path.insert(0, _DemoLoader())
