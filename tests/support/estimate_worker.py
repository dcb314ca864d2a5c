"""Every rank of ``torchrun --nproc_per_node 2 tests/support/estimate_worker.py RUN_DIR``: one process group,
one short fit per strategy in turn (DDP, ZeRO-1, FSDP grad_op, FSDP full, pipeline), each writing
this rank's measured training-state bytes to ``RUN_DIR/<name>/memory_rank<r>.json`` for
tests/unit/tools/test_estimate.py. One launch for all five keeps the suite's cost to one start-up."""

import json
import os
import sys
from datetime import timedelta

# Run as a script: the repository root on the path, so that `tests.support` imports.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.support.helpers import BlockRegressor, new_trainer  # noqa: E402

#: name -> (strategy, its options): the layouts tests/unit/tools/test_estimate.py estimates
LAYOUTS = {
    "ddp": ("ddp", {}),
    "zero1": ("ddp", {"zero1": True}),
    "fsdp_grad_op": ("fsdp", {"sharding": "grad_op"}),
    "fsdp_full": ("fsdp", {"sharding": "full"}),
    "pipeline": ("pipeline", {}),
}
#: uneven sizes: 13 rows split over 2 ranks pad to 7 + 7, the head's single row to 1 + 1, and
#: ZeRO-1's greedy whole-parameter shares differ between the ranks
MODULE = dict(width=13, depth=3)


class MeasuredRegressor(BlockRegressor):
    """Measures at the agreed point: after the first optimizer step, before the gradients are zeroed
    (gradients and optimizer state both held): ``on_train_step_end`` of step 1 (the gradients are
    zeroed after the next step's first forward, as Lightning)."""

    def on_train_step_end(self, step, metrics):
        if step != 1:
            return
        import torch

        from trainer.runtime.memory import training_state_bytes

        stepping = self.trainer.strategy.stepping_optimizer(self.trainer.optimizers[0])  # ZeRO-1: the one holding the state
        rank = torch.distributed.get_rank()
        with open(os.path.join(self.trainer.run_dir, f"memory_rank{rank}.json"), "w") as f:
            json.dump(training_state_bytes(self, stepping, allocated=True), f)


def main(run_dir: str) -> None:
    from trainer.runtime import distributed
    from trainer.runtime.launch import detect_environment
    from trainer.strategies import resolve_strategy

    # Joined here, once: every fit below uses this group and leaves it to us.
    distributed.init_process_group(detect_environment(), "gloo", timedelta(seconds=120))
    for name, (strategy, options) in LAYOUTS.items():
        new_trainer(os.path.join(run_dir, name), strategy=resolve_strategy(strategy, **options), devices=2,
                    batch_size=4, max_steps=1, loggers=[], checkpoint=None).fit(MeasuredRegressor(**MODULE))
    distributed.destroy_process_group(True)


if __name__ == "__main__":
    main(sys.argv[1])
