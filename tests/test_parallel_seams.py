"""Seams between parallelism and the rest of the trainer (issue 12, items 8-14): pipeline
randomness, sync batch norm under pipeline and with padding micro-batches, the node-local rank
under SLURM, ``init_from`` into pipeline stages, the collective recorder under every strategy and
pipeline's token weighting.

Tolerances: CPU fp32, rtol=1e-5 / atol=1e-6 (sums reordered across ranks and microbatches).
"""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest
import torch

from helpers import BlockRegressor, fit, read_metrics
from trainer.strategies.pipeline import PipelineStrategy

pytestmark = pytest.mark.timeout(300)
TOL = dict(rtol=1e-5, atol=1e-6)


def assert_same(a, b):
    (losses_a, params_a), (losses_b, params_b) = a, b
    assert len(losses_a) == len(losses_b) > 0
    torch.testing.assert_close(torch.tensor(losses_a), torch.tensor(losses_b), **TOL)
    assert params_a.keys() == params_b.keys()
    for name in params_a:
        torch.testing.assert_close(params_a[name], params_b[name], **TOL, msg=f"parameter {name} differs")


# ----- 11: the node-local rank under plain srun ---------------------------------------------------------------
def test_rank_zero_first_local_uses_the_cluster_environment_under_slurm(monkeypatch):
    # Plain srun sets SLURM_LOCALID, not LOCAL_RANK: the first task on the second node (global
    # rank 2 of 2 nodes x 2 tasks) is that node's local rank 0 and must prepare its data first.
    from trainer import distributed
    from trainer.launch import detect_environment

    env = detect_environment({"SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS": "4", "SLURM_NNODES": "2",
                              "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "7"})
    assert env.launcher == "slurm" and env.local_rank == 0 and env.rank == 2
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: None)
    monkeypatch.setattr(torch.distributed, "new_group", lambda *a, **k: None)
    distributed.init_process_group(env, "gloo", timedelta(seconds=5))  # records the environment
    monkeypatch.setattr(distributed, "is_distributed", lambda: True)
    monkeypatch.setattr(distributed, "rank", lambda: 2)
    barriers = []
    monkeypatch.setattr(distributed, "barrier", lambda: barriers.append(1))
    try:
        with distributed.rank_zero_first(local=True) as first:
            assert first and not barriers  # went first, nobody waited for
        assert barriers == [1]  # then released the node's other tasks
        with distributed.rank_zero_first(local=False) as first:
            assert not first  # job-wide, rank 2 waits for rank 0
    finally:
        distributed._environment = None
        distributed._control_group = None


# ----- 14 (pipeline part): token weighting in fp64, not the loss dtype -------------------------------------------
def test_pipeline_token_weight_is_exact_for_a_bf16_loss():
    # bf16 holds integers exactly only up to 256: 257 tokens x a bf16 loss of 1 must weigh 257.
    class Loss:
        def pipeline_loss(self, output, batch):
            return {"loss": torch.ones((), dtype=torch.bfloat16), "num_tokens": torch.tensor(257.0)}

    strategy = PipelineStrategy()
    strategy._module, strategy._batch, strategy._real, strategy._records = Loss(), torch.zeros(4, 1), 4, {}
    strategy._scale, strategy._by_tokens, strategy._scale_loss = 1.0, True, lambda loss: loss
    weighted = strategy._loss_fn(torch.zeros(4, 1), torch.arange(4))
    assert weighted.dtype in (torch.float32, torch.float64) and weighted.item() == 257.0
