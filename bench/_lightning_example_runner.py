"""Runs one Lightning-style program as its own command line runs it, recording each training batch's loss.

    python bench/_lightning_example_runner.py MODE OUT_DIR DEFAULTS_JSON PROGRAM [ARGS...]

``MODE`` is ``lightning`` (the program as written, under Lightning) or ``mirror`` (a copy of the program
with its imports rewritten to ``trainer.lightning``, made by bench/_lightning_example_harness.py).
The program runs as ``__main__`` with ``sys.argv = [PROGRAM, *ARGS]``. Two things are added around it,
neither in its code:

- a callback appended to every Trainer the program builds, which writes one JSON line per training batch
  to ``OUT_DIR/losses-rank<R>.jsonl``: the epoch, ``batch_idx``, the loss ``training_step`` returned
  (``outputs["loss"]`` times the accumulation, so the batch's own loss) and the batch's sample count;
- ``DEFAULTS_JSON``: Trainer arguments used where the program does not pass them (what Lightning's
  ``PL_TRAINER_<NAME>`` variables do), for the programs without a command line of their own:
  ``{"devices": 2, "strategy": "ddp"}``;
- torch's, numpy's and ``random``'s global generators seeded with 0 before the program starts, so that a
  program that seeds nothing itself (random data and weights at import) draws the same under both.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import runpy
import sys

_MODE_VARIABLE = "LIGHTNING_EXAMPLE_MODE"  # read by spawned ranks too, which import this module by name
if __name__ == "__main__":
    os.environ[_MODE_VARIABLE] = sys.argv[1]


def _callback_base() -> type:
    if os.environ[_MODE_VARIABLE] == "lightning":
        from lightning.pytorch import Callback
    else:
        from trainer.lightning import Callback
    return Callback


def _batch_size(batch) -> int:
    if hasattr(batch, "shape"):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)) and batch:
        return _batch_size(batch[0])
    return 1


class LossRecorder(_callback_base()):
    """One JSON line per training batch (see the module docstring)."""

    def __init__(self, out_dir: str):
        self.out_dir = out_dir

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        accumulate = getattr(trainer, "accumulate_grad_batches", 1) or 1
        row = {"epoch": trainer.current_epoch, "batch_idx": batch_idx,
               "loss": float(loss.detach().float()) * accumulate, "n": _batch_size(batch)}
        with open(os.path.join(self.out_dir, f"losses-rank{trainer.global_rank}.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")


def _patch_trainer(trainer_class: type, out_dir: str, defaults: dict) -> None:
    original = trainer_class.__init__

    @functools.wraps(original)  # (LightningCLI reads the Trainer's arguments from its signature)
    def __init__(self, *args, **kwargs):
        for name, value in defaults.items():
            kwargs.setdefault(name, value)
        callbacks = kwargs.get("callbacks") or []
        callbacks = list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
        kwargs["callbacks"] = callbacks + [LossRecorder(out_dir)]
        original(self, *args, **kwargs)

    __init__.__signature__ = inspect.signature(original)
    trainer_class.__init__ = __init__


def main(argv: list[str]) -> None:
    mode, out_dir, defaults, program, *args = argv
    os.makedirs(out_dir, exist_ok=True)
    if mode == "lightning":
        import lightning.pytorch as framework
    else:
        import trainer.lightning as framework
    _patch_trainer(framework.Trainer, out_dir, json.loads(defaults))
    import random

    import numpy
    import torch

    random.seed(0)
    numpy.random.seed(0)
    torch.manual_seed(0)
    sys.argv = [program, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(program)))
    runpy.run_path(program, run_name="__main__")


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    # The callback's class is this module's, by name: spawned ranks import it as a module, not as __main__.
    from _lightning_example_runner import main as _main

    _main(sys.argv[1:])
