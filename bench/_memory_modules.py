"""The module bench/strategy_memory.py trains, in its own file: spawned workers unpickle it by name."""

from __future__ import annotations

import json
import os
import resource

import torch

from trainer.recipes.gpt import GPTModule


class MeasuredGPT(GPTModule):
    """recipes/gpt.py's module without validation; after the first optimizer step, before the gradients
    are zeroed (gradients and optimizer state both held), each rank writes its training-state bytes and
    its peak RSS to ``<out>/rank<r>.json``."""

    def __init__(self, out: str, **kwargs):
        super().__init__(**kwargs)
        self.out = out

    def val_dataset(self):
        return None

    def on_train_step_end(self, step, metrics):
        if step != 1:
            return
        from trainer.runtime.memory import training_state_bytes

        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        stepping = self.trainer.strategy.stepping_optimizer(self.trainer.optimizers[0])  # ZeRO-1: the one holding the state
        figures = training_state_bytes(self, stepping, allocated=True)
        figures["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        with open(os.path.join(self.out, f"rank{rank}.json"), "w") as f:
            json.dump(figures, f)
