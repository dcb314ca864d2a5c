"""Every rank of ``torchrun --nproc_per_node N tests/support/dry_run_worker.py RUN_DIR LAYOUT``: real runs
on gloo of ``TPRegressor`` (a module of one's own with its plan) and of the llama recipe (its plan:
sequence parallel, loss parallel) under ``strategy=nd`` (tp 2; dp_shard 2 x tp 2), and on 4 ranks of the
llama recipe under ``strategy=pipeline`` with 2 stages x tp 2, each measured after its first optimizer
step (gradients and optimizer state held), for tests/multiprocess/tools/test_dry_run_measured.py.

Writes ``RUN_DIR/<run>/rank<r>.json``: each parameter's local storage bytes (what the rank allocates for it:
FSDP's padded shard, a TP piece) and ``training_state_bytes(..., allocated=True)``.
"""

import json
import os
import sys
from datetime import timedelta

# Run as a script: the repository root on the path, so that `tests.support` imports.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.support.helpers import new_trainer  # noqa: E402
from tests.support.tp_modules import TPRegressor  # noqa: E402
from trainer.recipes.llama import LlamaModule  # noqa: E402

#: the module the test lays out (uneven: 10 hidden rows over tp 2 and dp_shard 2 pad)
MODULE = dict(width=6, hidden=10, depth=2)


class Measured:
    """Measures after the first optimizer step, before the gradients are zeroed (as
    tests/support/estimate_worker.py): each parameter's local storage and the training state."""

    def on_train_step_end(self, step, metrics):
        if step != 1:
            return
        import torch

        from trainer.runtime.memory import _local, training_state_bytes

        shards = {name: _local(p).untyped_storage().nbytes() for name, p in self.named_parameters()}
        grads = {name: [tuple(_local(p.grad).shape), _local(p.grad).untyped_storage().nbytes()]
                 for name, p in self.named_parameters() if p.grad is not None}
        state = training_state_bytes(self, self.trainer.optimizers[0], allocated=True)
        with open(os.path.join(self.trainer.run_dir, f"rank{torch.distributed.get_rank()}.json"), "w") as f:
            json.dump({"shards": shards, "grads": grads, "state": state}, f)


class MeasuredTP(Measured, TPRegressor):
    pass


class MeasuredLlama(Measured, LlamaModule):
    pass


def llama_config():
    """The llama recipe's module node (its debug size), as ``trainer`` composes it."""
    from trainer.estimate.__main__ import compose

    return compose(["recipe=llama"]).module


#: layout name -> (world, [(run name, module, strategy name, strategy options)]): what each launch fits
LAYOUTS = {
    "tp2": (2, [("tp_regressor", "tp_regressor", "nd", {"dp_shard": 1, "tp": 2}),
                ("llama", "llama", "nd", {"dp_shard": 1, "tp": 2})]),
    "fsdp2_tp2": (4, [("tp_regressor", "tp_regressor", "nd", {"dp_shard": 2, "tp": 2}),
                      ("llama", "llama", "nd", {"dp_shard": 2, "tp": 2}),
                      ("llama_pp2_tp2", "llama", "pipeline", {"stages": 2, "tp": 2})]),
}


def main(run_dir: str, layout: str) -> None:
    from hydra.utils import instantiate

    from trainer.runtime import distributed
    from trainer.runtime.launch import detect_environment
    from trainer.strategies import resolve_strategy

    distributed.init_process_group(detect_environment(), "gloo", timedelta(seconds=120))
    world, runs = LAYOUTS[layout]
    modules = {"tp_regressor": lambda: MeasuredTP(**MODULE),
               "llama": lambda: instantiate(llama_config(), _target_=f"{__name__}.MeasuredLlama")}
    for name, module, strategy, options in runs:
        new_trainer(os.path.join(run_dir, name), strategy=resolve_strategy(strategy, **options), devices=world,
                    batch_size=4, max_steps=1, loggers=[], checkpoint=None, limit_val_batches=1,
                    num_sanity_val_steps=0).fit(modules[module]())  # least validation: the training state is measured
    distributed.destroy_process_group(True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
