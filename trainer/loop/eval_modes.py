"""The module's mode around an evaluation pass, through Lightning's hooks: ``on_<stage>_model_eval``
before (default ``self.eval()``), and after, ``on_<stage>_model_train`` where the module overrides
it, else every submodule's ``training`` flag put back as it was (a frozen submodule stays in eval)."""

from __future__ import annotations

from typing import Any

from trainer.api.module import TrainModule
from trainer.api.lightning_hooks import overrides


class EvalModes:
    """``enter()`` before a pass of ``stage`` ("validation", "test", "predict"), ``exit()`` after it."""

    def __init__(self, hooks: Any, stage: str):
        self.hooks, self.module, self.stage = hooks, hooks.module, stage  # hooks: the run's dispatcher
        self.modes: list[tuple[Any, bool]] = []

    def enter(self) -> None:
        self.modes = [(submodule, submodule.training) for submodule in self.module.modules()]
        self.hooks.call_module(f"on_{self.stage}_model_eval")

    def exit(self) -> None:
        hook = f"on_{self.stage}_model_train"
        if hasattr(TrainModule, hook) and overrides(self.module, TrainModule, hook):
            self.hooks.call_module(hook)
            return
        for submodule, training in self.modes:
            submodule.training = training
