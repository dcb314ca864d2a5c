"""Lightning names this trainer does not have: an ImportError that says what to use instead.

A mirror module lists such names in a dict ``{name: what to use}`` and defines
``__getattr__ = missing_names(__name__, that_dict)``: ``from trainer.lightning.callbacks import
RichProgressBar`` then fails at import time with the advice, instead of a silent stand-in. A name
Lightning does not have either is the usual AttributeError.
"""

from __future__ import annotations

from typing import Any, Callable


def missing_names(module: str, missing: dict[str, str]) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` raising ImportError (with the advice) for the names in ``missing``."""
    if module == "trainer.lightning" or module.startswith("trainer.lightning.fabric"):
        lightning_module = module.replace("trainer.lightning", "lightning", 1)
    else:
        lightning_module = module.replace("trainer.lightning", "lightning.pytorch", 1)

    def __getattr__(name: str) -> Any:
        if name in missing:
            raise ImportError(
                f"{lightning_module}.{name} (Lightning's) does not exist in this trainer ({module}); "
                f"use {missing[name]}"
            )
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
