"""The trainer's Hydra plugins: ``hydra/sweeper=optuna`` (trainer/cli/optuna_sweeper.py).

Hydra imports every module under ``hydra_plugins`` when it starts, in every Hydra program of the
environment: this one imports nothing of the trainer (nor torch, nor Optuna) until a sweep uses it.
"""

from __future__ import annotations

from typing import Any

from hydra.plugins.sweeper import Sweeper


class OptunaSweeper(Sweeper):
    """Hydra's name for the trainer's Optuna sweeper; the work is `trainer.cli.optuna_sweeper.OptunaTrialSweeper`'s."""

    def __init__(self, **settings: Any) -> None:
        from trainer.cli.optuna_sweeper import OptunaTrialSweeper

        self.implementation = OptunaTrialSweeper(**settings)

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        self.implementation.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        return self.implementation.sweep(arguments)
