"""Lightning names and modules this trainer does not have: an ImportError that says what to use instead.

A mirror module lists such names in a dict ``{name: what to use}`` and defines
``__getattr__ = missing_names(__name__, that_dict)``: ``from trainer.lightning.callbacks import
RichProgressBar`` then fails at import time with the advice, instead of a silent stand-in. A name
Lightning does not have either is the usual AttributeError.

A module under ``trainer.lightning`` that does not exist (``trainer.lightning.tuner``) is a
ModuleNotFoundError with the advice of ``MISSING_MODULES``, or a pointer to the mirror's page
(``MissingModuleFinder``, installed by ``trainer/lightning/__init__.py``).
"""

from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder
from typing import Any, Callable, Sequence

#: Lightning's modules (as their ``trainer.lightning`` path) this trainer has no mirror of -> what to use
MISSING_MODULES = {
    "trainer.lightning.demos": "a LightningModule of your own (Lightning's demos run here with their imports rewritten)",
    "trainer.lightning.loops": "hooks and callbacks (this trainer has one loop: trainer/loop/)",
    "trainer.lightning.plugins": "Trainer(precision=...) and a trainer.strategies Strategy instance",
    "trainer.lightning.profilers": "Trainer(profile=...)",
    "trainer.lightning.tuner": "Trainer(auto_batch_size=True) (there is no learning-rate finder)",
}

#: where a module without its own advice points to
_SEE_DOCS = "the names trainer.lightning mirrors (docs/lightning.md lists them and the differences)"


def lightning_path(module: str) -> str:
    """Lightning's path of the mirror module ``module`` (``trainer.lightning.callbacks`` ->
    ``lightning.pytorch.callbacks``; ``trainer.lightning`` and ``.fabric`` -> ``lightning`` ...)."""
    if module == "trainer.lightning" or module.startswith("trainer.lightning.fabric"):
        return module.replace("trainer.lightning", "lightning", 1)
    return module.replace("trainer.lightning", "lightning.pytorch", 1)


class MissingModuleFinder(MetaPathFinder):
    """Last on ``sys.meta_path``: asked only for a module no other finder has. Under
    ``trainer.lightning`` that module is Lightning's and not mirrored: a ModuleNotFoundError that says
    what to use; any other module is not its business (None)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None, target: Any = None) -> None:
        if not fullname.startswith("trainer.lightning."):
            return None
        advice = next((MISSING_MODULES[prefix] for prefix in sorted(MISSING_MODULES, key=len, reverse=True)
                       if fullname == prefix or fullname.startswith(prefix + ".")), _SEE_DOCS)
        raise ModuleNotFoundError(f"{lightning_path(fullname)} (Lightning's) does not exist in this trainer "
                                  f"({fullname}); use {advice}", name=fullname)


def install_missing_module_finder() -> None:
    """Put one ``MissingModuleFinder`` at the end of ``sys.meta_path`` (once per process)."""
    if not any(isinstance(finder, MissingModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MissingModuleFinder())


def missing_names(module: str, missing: dict[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` raising ImportError (with the advice) for the names in ``missing``."""
    lightning_module = lightning_path(module)

    def __getattr__(name: str) -> Any:
        if name in missing:
            raise ImportError(
                f"{lightning_module}.{name} (Lightning's) does not exist in this trainer ({module}); "
                f"use {missing[name]}"
            )
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
