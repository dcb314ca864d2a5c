"""Every rank of ``torchrun --nproc_per_node N tests/support/dry_run_worker.py RUN_DIR DP_SHARD TP``: a real
run of ``TPRegressor`` laid out dp_shard x tp on gloo, measured after its first optimizer step (gradients
and optimizer state held), for tests/multiprocess/tools/test_dry_run_measured.py.

Writes ``RUN_DIR/rank<r>.json``: each parameter's local storage bytes (what the rank allocates for it:
FSDP's padded shard, a TP piece) and ``training_state_bytes(..., allocated=True)``.
"""

import json
import os
import sys

# Run as a script: the repository root on the path, so that `tests.support` imports.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from tests.support.helpers import regression_data  # noqa: E402
from tests.support.tp_modules import TPRegressor  # noqa: E402

#: the module the test lays out (uneven: 10 hidden rows over tp 2 and dp_shard 2 pad)
MODULE = dict(width=6, hidden=10, depth=2)


def main(run_dir: str, dp_shard: int, tp: int) -> None:
    from torch.distributed.fsdp import fully_shard

    from trainer.runtime.memory import _local, training_state_bytes
    from trainer.strategies.parallel_dims import ParallelDims
    from trainer.strategies.tensor_parallel import apply_plan, expand_plan
    from trainer.strategies.wrap_policy import select_units

    dist.init_process_group("gloo")
    dims = ParallelDims.resolve(dist.get_world_size(), dp_shard=dp_shard, tp=tp)
    mesh, _ = dims.build_mesh("cpu")
    torch.manual_seed(0)
    module = TPRegressor(**MODULE)
    module.configure_model()
    apply_plan(module, expand_plan(module, module.tensor_parallel_plan()), mesh["tp"])
    if dims.dp > 1:
        for unit in select_units(module, "auto", module.block_classes()):
            fully_shard(unit, mesh=mesh["dp_shard"])
        fully_shard(module, mesh=mesh["dp_shard"])
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.01)
    x, y = regression_data(8).tensors
    F.mse_loss(module(x), y).backward()
    optimizer.step()
    shards = {name: _local(p).untyped_storage().nbytes() for name, p in module.named_parameters()}
    state = training_state_bytes(module, optimizer, allocated=True)
    with open(os.path.join(run_dir, f"rank{dist.get_rank()}.json"), "w") as f:
        json.dump({"shards": shards, "state": state}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
