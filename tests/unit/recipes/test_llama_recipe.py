"""recipe=llama: its pieces (grouped-query attention, rotary embeddings), that it trains through
``train.py``, and that FSDP on 2 ranks and a 2-stage pipeline train it as one process does.

Tolerance of the equivalence runs: CPU fp32, AdamW (lr 3e-3), rtol=1e-5 / atol=1e-5 over 4 steps. FSDP
and the pipeline sum the same gradients in another order (~1e-7 relative); AdamW divides each update
by the gradient's own scale, so an element whose gradient is near zero turns that into up to 2e-6
(measured 2026-11-23, this machine: 1.8e-6 in one SwiGLU weight, FSDP bitwise equal to DDP; losses
within 3e-8). 1e-5 stays far below one step's update (~lr = 3e-3) that a wrong gradient would change.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from tests.support.helpers import REPO, read_metrics, run_trainer, train_losses
from trainer.recipes.llama import Attention, LlamaBlock, LlamaModule, apply_rope, ffn_hidden_size, rope_angles
from tests.support.same_training import assert_same_training
from tests.support.command_line import TRAIN, run
from trainer.strategies.fsdp import FSDPStrategy
from trainer.strategies.pipeline import PipelineStrategy
from trainer.strategies.weight_init import WeightInit, has_meta_tensors
from trainer.strategies.wrap_policy import select_units

pytestmark = pytest.mark.timeout(300)
TOL = dict(rtol=1e-5, atol=1e-5)
STEPS = 4
GLOBAL_BATCH = 8


def small_llama() -> LlamaModule:
    """4 query heads over 2 key/value heads, so the equivalence runs go through grouped-query attention."""
    return LlamaModule(optimizer=functools.partial(torch.optim.AdamW, lr=3e-3), max_bytes=40_000, block_size=16,
                       layers=2, width=32, heads=4, kv_heads=2, ffn_multiple_of=16)


# ----- the pieces ---------------------------------------------------------------------------------------
def test_grouped_query_attention_shapes_and_sharing():
    torch.manual_seed(0)
    attention = Attention(width=32, heads=4, kv_heads=2, rope_theta=10000.0, out_std=0.02)
    assert attention.wq.weight.shape == (32, 32) and attention.wk.weight.shape == (16, 32)
    assert attention.wv.weight.shape == (16, 32) and attention.wo.weight.shape == (32, 32)
    x = torch.randn(3, 5, 32)
    out = attention(x)
    assert out.shape == x.shape
    # The same as multi-head attention whose key/value heads 0, 0, 1, 1 repeat each shared one.
    q = attention.wq(x).view(3, 5, 4, 8).transpose(1, 2)
    k, v = (w(x).view(3, 5, 2, 8).transpose(1, 2).repeat_interleave(2, dim=1) for w in (attention.wk, attention.wv))
    cos, sin = rope_angles(5, 8, 10000.0)
    expected = F.scaled_dot_product_attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, is_causal=True)
    torch.testing.assert_close(out, attention.wo(expected.transpose(1, 2).reshape(3, 5, 32)), rtol=1e-5, atol=1e-6)
    # Causal: the first position's output does not depend on later positions.
    changed = x.clone()
    changed[:, 1:] += 1.0
    torch.testing.assert_close(attention(changed)[:, 0], out[:, 0])
    assert not torch.allclose(attention(changed)[:, 1], out[:, 1])


def test_rotary_embedding_is_a_rotation_by_relative_position():
    torch.manual_seed(0)
    head_dim, positions = 8, 12
    cos, sin = rope_angles(positions, head_dim, theta=100.0)
    q_vector, k_vector = torch.randn(head_dim), torch.randn(head_dim)
    # the same vector at every position: what changes from row to row is the rotation alone
    q = apply_rope(q_vector.expand(1, 1, positions, head_dim), cos, sin)[0, 0]
    k = apply_rope(k_vector.expand(1, 1, positions, head_dim), cos, sin)[0, 0]
    torch.testing.assert_close(q.norm(dim=-1), q_vector.norm().expand(positions))  # a rotation keeps norms
    torch.testing.assert_close(q[0], q_vector)  # position 0 is not turned
    scores = q @ k.T  # scores[m, n] = q_m . k_n
    for offset in range(-positions + 1, positions):
        diagonal = torch.diagonal(scores, offset=-offset)  # every (m, n) with m - n = offset
        torch.testing.assert_close(diagonal, diagonal[0].expand_as(diagonal), rtol=1e-5, atol=1e-5)
    assert (torch.diagonal(scores, 0)[0] - torch.diagonal(scores, -1)[0]).abs() > 1e-3  # m - n matters


def test_forward_and_backward_read_nothing_back_to_the_host():
    from tests.support.helpers import HostSyncCounter

    module = small_llama()
    module.configure_model()
    x, y = module.train_dataset()[0]
    with HostSyncCounter() as counter:
        module.training_step((x[None], y[None]), 0)["loss"].backward()
    assert counter.count == 0, counter.where


def test_sizes_and_bad_settings():
    assert ffn_hidden_size(128, 32, None) == 352 and ffn_hidden_size(4096, 256, None) == 11008  # Llama 2 7B
    assert ffn_hidden_size(4096, 1024, 1.3) == 14336  # Llama 3 8B
    block = LlamaBlock(32, 4, 1, 64, 10000.0, 1e-5, 0.02)  # multi-query: one key/value head
    assert block.attention.wk.weight.shape == (8, 32) and block(torch.randn(2, 3, 32)).shape == (2, 3, 32)
    assert LlamaModule(kv_heads=None).model_args["kv_heads"] == 4  # null = multi-head
    bad = {
        "module.kv_heads=3 must divide module.heads=4": dict(kv_heads=3),
        "module.width=100 must be divisible by module.heads=8": dict(width=100, heads=8),
        r"\(the head size\) must be even": dict(width=36, heads=4),
        "module.layers=0 must be >= 1": dict(layers=0),
        "module.rope_theta=0 must be > 0": dict(rope_theta=0),
        r"data.path='/no/such.txt' is not a file": dict(data_path="/no/such.txt"),
    }
    for message, kwargs in bad.items():
        with pytest.raises((ValueError, FileNotFoundError), match=message):
            LlamaModule(**kwargs)
    # The vocabulary is the data's (bytes: 256); a smaller module.vocab_size is refused when the model is built.
    with pytest.raises(ValueError, match="module.vocab_size=100 is below the data's vocabulary of 256"):
        LlamaModule(vocab_size=100, max_bytes=4096).configure_model()
    padded = LlamaModule(vocab_size=320, max_bytes=4096)
    padded.configure_model()
    assert padded.model.output.weight.shape[0] == 320


def test_meta_build_equals_eager_build():
    # LlamaModule owns initialisation (init_weights), so eager and meta builds are identical,
    # the depth-scaled output projections included.
    eager = small_llama()
    torch.manual_seed(5)
    eager.configure_model()
    WeightInit(eager, seed=5).eager()
    meta = small_llama()
    torch.manual_seed(5)
    with torch.device("meta"):
        meta.configure_model()
    assert has_meta_tensors(meta)
    units = select_units(meta, "auto", meta.block_classes())
    assert [type(u) for u in units] == [LlamaBlock, LlamaBlock]
    WeightInit(meta, seed=5).materialize(torch.device("cpu"), units, lambda unit: None)
    for (name, a), (_, b) in zip(eager.state_dict().items(), meta.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    attention = eager.model.layers[0].attention
    assert 0.008 < float(attention.wo.weight.detach().std()) < 0.012  # 0.02 / sqrt(2 x 2 layers)
    assert 0.017 < float(attention.wq.weight.detach().std()) < 0.023


# ----- training -----------------------------------------------------------------------------------------
def test_trains_through_train_py(tmp_path):
    result = run(TRAIN + ["recipe=llama", "trainer.max_steps=20", "trainer.log_every_n_steps=5",
                          "trainer.val_every_n_steps=20", "trainer.progress_bar=false", "module.max_bytes=100000",
                          "checkpoint.save_last=false", "logger=[jsonl]", f"hydra.run.dir={tmp_path}"])
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_metrics(str(tmp_path))
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert len(losses) == 4 and losses[-1] < 0.8 * losses[0], losses
    assert [r["val/bits_per_byte"] for r in rows if "val/bits_per_byte" in r]  # gpt's metric, as gpt logs it


def fit_llama(path, **options) -> tuple[list[float], dict]:
    """Losses and the caller's module's final weights (spawned runs copy them back)."""
    module = small_llama()
    run_trainer(path, module, max_steps=STEPS, **options)
    return train_losses(str(path)), {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    return fit_llama(tmp_path_factory.mktemp("single"), batch_size=GLOBAL_BATCH)


def test_one_process_learns(one_process):
    losses, params = one_process
    assert losses[-1] < losses[0] and "model.layers.1.feed_forward.w2.weight" in params


@pytest.mark.slow
def test_fsdp_two_ranks_equal_one_process(one_process, tmp_path):
    sharded = fit_llama(tmp_path, strategy=FSDPStrategy(), devices=2, batch_size=GLOBAL_BATCH // 2)
    assert_same_training(sharded, one_process, steps=STEPS, tol=TOL)


@pytest.mark.slow
def test_two_stage_pipeline_equals_one_process(one_process, tmp_path):
    piped = fit_llama(tmp_path, strategy=PipelineStrategy(schedule="1f1b", microbatches=4), devices=2,
                      batch_size=GLOBAL_BATCH)
    assert_same_training(piped, one_process, steps=STEPS, tol=TOL)
