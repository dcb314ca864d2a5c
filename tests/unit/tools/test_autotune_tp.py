"""The autotuner's tensor-parallel candidates (trainer/autotune/candidates.py): strategy=nd with each TP
degree that divides the world and that the module accepts, keeping the global batch."""


import pytest

from tests.support.autotune_jobs import job_for
from trainer.autotune import candidates as cands
from trainer.autotune.runner import describe, plan
from trainer.autotune.settings import AutotuneError, check_settings


def test_llama_on_4_ranks_gets_the_tp_degrees_its_kv_heads_allow(tmp_path):
    # llama's debug size: 4 heads, 2 kv heads: tp 2 divides both, tp 4 does not.
    job = job_for(["recipe=llama", "trainer.devices=4", "autotune.strategies=[fsdp_full,nd]",
                   "autotune.activation_checkpointing=[false]", "autotune.micro_batch_sizes=[16]"], tmp_path)
    batch, candidates = plan(job)
    assert [c.strategy for c in candidates] == ["fsdp_full", "nd_tp2"]
    fsdp, tp2 = candidates
    assert (fsdp.accumulation, tp2.accumulation, tp2.tp) == (1, 2, 2)
    # the same global batch: micro x accumulation x data-parallel ranks (4 / tp)
    assert fsdp.micro_batch_size * fsdp.accumulation * 4 == tp2.micro_batch_size * tp2.accumulation * (4 // 2) == batch.size
    assert tp2.overrides() == ["strategy=nd", "strategy.tp=2", "strategy.dp_shard=-1", "data.batch_size=16",
                               "trainer.accumulate_grad_batches=2", "trainer.activation_checkpointing=false"]
    assert "no tensor-parallel" not in describe(job, batch, candidates)
    assert "nd_tp<T> candidate's T ranks share their samples: 4 / T data-parallel ranks" in describe(job, batch, candidates)


def test_degrees_are_checked_and_a_module_without_a_plan_gets_none(tmp_path):
    llama = job_for(["recipe=llama"], tmp_path).config.module
    assert cands.tensor_parallel_degrees(None, llama, 8) == [2]
    assert cands.tensor_parallel_degrees([], llama, 8) == []
    with pytest.raises(AutotuneError, match=r"strategy.tp=4 must divide module.heads=4, module.kv_heads=2.*allowed here: \[2\]"):
        cands.tensor_parallel_degrees([4], llama, 8)
    with pytest.raises(AutotuneError, match=r"3 does not divide trainer.devices=8"):
        cands.tensor_parallel_degrees([3], llama, 8)
    mlp = job_for(["recipe=mlp"], tmp_path).config.module
    assert cands.tensor_parallel_degrees(None, mlp, 4) == []
    with pytest.raises(AutotuneError, match=r"tp_degrees=\[2\]: MLPClassifier declares no tensor_parallel_plan"):
        cands.tensor_parallel_degrees([2], mlp, 4)
    job = job_for(["recipe=mlp", "trainer.devices=2"], tmp_path)  # nd in the default list: said, not silent
    batch, candidates = plan(job)
    assert all(c.tp == 1 for c in candidates) and "no tensor-parallel (nd) candidates" in describe(job, batch, candidates)


def test_tp_settings_are_checked(tmp_path):
    block = {"budget_s": 300, "steps": 20, "warmup_steps": 5, "micro_batch_sizes": None, "activation_checkpointing": None,
             "out_dir": str(tmp_path), "strategies": ["ddp"], "tp_degrees": [2]}
    with pytest.raises(AutotuneError, match=r"tp_degrees=\[2\]: the tensor-parallel candidates need nd in autotune.strategies"):
        check_settings(block)
    with pytest.raises(AutotuneError, match=r"tp_degrees must be null or a list of integers >= 2"):
        check_settings({**block, "strategies": ["nd"], "tp_degrees": [1]})
    assert check_settings({**block, "strategies": ["ddp", "nd"], "tp_degrees": [2, 2]}).tp_degrees == [2]
