"""Every rank of ``torchrun --nproc_per_node N tests/support/dry_run_worker.py RUN_DIR DP_SHARD TP``: a real
run of ``TPRegressor`` under ``strategy=nd`` (dp_shard x tp) on gloo, measured after its first optimizer step
(gradients and optimizer state held), for tests/multiprocess/tools/test_dry_run_measured.py.

Writes ``RUN_DIR/rank<r>.json``: each parameter's local storage bytes (what the rank allocates for it:
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

#: the module the test lays out (uneven: 10 hidden rows over tp 2 and dp_shard 2 pad)
MODULE = dict(width=6, hidden=10, depth=2)


class MeasuredTP(TPRegressor):
    """Measures after the first optimizer step, before the gradients are zeroed (as
    tests/support/estimate_worker.py): each parameter's local storage and the training state."""

    def on_train_step_end(self, step, metrics):
        if step != 1:
            return
        import torch

        from trainer.runtime.memory import _local, training_state_bytes

        shards = {name: _local(p).untyped_storage().nbytes() for name, p in self.named_parameters()}
        state = training_state_bytes(self, self.trainer.optimizers[0], allocated=True)
        with open(os.path.join(self.trainer.run_dir, f"rank{torch.distributed.get_rank()}.json"), "w") as f:
            json.dump({"shards": shards, "state": state}, f)


def main(run_dir: str, dp_shard: int, tp: int) -> None:
    from trainer.runtime import distributed
    from trainer.runtime.launch import detect_environment
    from trainer.strategies import resolve_strategy

    distributed.init_process_group(detect_environment(), "gloo", timedelta(seconds=120))
    world = dp_shard * tp
    new_trainer(run_dir, strategy=resolve_strategy("nd", dp_shard=dp_shard, tp=tp), devices=world, batch_size=4,
                max_steps=1, loggers=[], checkpoint=None).fit(MeasuredTP(**MODULE))
    distributed.destroy_process_group(True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
