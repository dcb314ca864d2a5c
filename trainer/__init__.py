"""A PyTorch training framework: ``Trainer`` runs a ``TrainModule`` with a strategy plugin.

The packages are layers; each imports only the layers below it (``.importlinter`` checks it)::

    trainer.trainer, cli/, estimate/, autotune/, deepspeed_config/, lightning/   the facade, its tools, Lightning's import paths
    loop/                                    one rank's run (only the facade imports it)
    loggers/ | callbacks/ | observe/         sinks, built-in callbacks, progress / speed / profiling
    checkpoint/                              save, load, resume state by name; formats; integrity
    strategies/                              single, DDP, FSDP, pipeline; wrapping, init, speed-ups
    data/ | optim/ | precision/              batch plans and loaders; optimizers and schedules; precision
    api/                                     TrainModule, DataModule, Callback, the run view
    runtime/                                 processes, launch, seeding, rank logging, meters

Each package's docstring lists its files.
"""

import gc as _gc

# torch's and this package's modules are over a million objects that live as long as the process. A full
# collection walks every one (about 0.1 s each on a small CPU), and these imports alone would trigger
# several: collect nothing while importing, then move what exists to the permanent generation
# (gc.freeze), which later collections skip. Cycles made from here on are collected as before.
_collecting = _gc.isenabled()
_gc.disable()
try:
    from trainer.api.datamodule import DataModule
    from trainer.api.module import TrainModule
    from trainer.data.streaming import ShardedIterable
    from trainer.runtime.distributed import rank_zero_first
    from trainer.runtime.seeding import seed_everything
    from trainer.trainer import Trainer
finally:
    _gc.freeze()
    if _collecting:
        _gc.enable()

__all__ = ["DataModule", "ShardedIterable", "Trainer", "TrainModule", "rank_zero_first", "seed_everything"]
__version__ = "0.1.0"
