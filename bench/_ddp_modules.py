"""The modules bench/ddp_overhead.py trains, in their own file: spawned workers unpickle them by
name (Lightning's module is in bench/_lightning_gpt.py: the other contenders' workers do not import Lightning)."""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

from trainer.recipes.gpt import GPT, GPTModule


def stamp(stamps: str, key: str) -> None:
    """Write the wall clock (shared by the processes) and this process's CPU time (all its threads:
    less sensitive than the wall clock to other work on a shared machine) under ``key``."""
    with open(os.path.join(stamps, key), "w") as f:
        f.write(f"{time.time()!r} {time.process_time()!r}")


class TimedGPTModule(GPTModule):
    """recipes/gpt.py's module without validation; rank 0 notes its first step and its last step's end."""

    def __init__(self, stamps: str, **kwargs):
        super().__init__(**kwargs)
        self.stamps = stamps

    def val_dataset(self):
        return None

    def training_step(self, batch, batch_idx):
        # (trainer.global_step is set when fit ends, and batch_idx restarts every epoch: stamp once)
        if torch.distributed.get_rank() == 0 and not os.path.exists(os.path.join(self.stamps, "first")):
            stamp(self.stamps, "first")
        return super().training_step(batch, batch_idx)

    def on_train_step_end(self, step, metrics):
        if step == self.trainer.max_steps and torch.distributed.get_rank() == 0:
            stamp(self.stamps, "last")
