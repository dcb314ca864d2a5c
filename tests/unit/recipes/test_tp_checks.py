"""The gpt and llama recipes' tensor-parallel side without processes: the degree checks (one line,
naming the values and the allowed degrees: the heads and the block size), the plans' names against the built models, the head's
two layouts (loss parallel on / off), and gpt's older fused-qkv checkpoints loading into the split
q / k / v projections (the same function, to fp32 rounding: rtol 1e-6, atol 1e-6)."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel

from trainer.recipes.gpt import GPT, GPTModule
from trainer.recipes.llama import Llama, LlamaModule
from trainer.strategies.tensor_parallel import expand_plan, module_plan

VOCAB = 64


def gpt_module(vocab: int = VOCAB) -> GPTModule:
    module = GPTModule(block_size=16, layers=2, heads=4, width=32)
    module.model = GPT(vocab_size=vocab, **module.model_args)
    return module


def llama_module() -> LlamaModule:
    module = LlamaModule(block_size=16, layers=2, width=32, ffn_multiple_of=16)
    module.model = Llama(vocab_size=VOCAB, **module.model_args)
    return module


# ----- the degree checks -----------------------------------------------------------------------------
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_gpt_accepts_degrees_dividing_the_heads_and_the_block(tp):
    GPTModule(heads=4, width=32, block_size=16).check_tensor_parallel(tp)


@pytest.mark.parametrize("tp", [3, 8])
def test_gpt_refuses_degrees_not_dividing_the_heads_in_one_line(tp):
    with pytest.raises(ValueError) as error:
        GPTModule(heads=4, width=32, block_size=16).check_tensor_parallel(tp)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"strategy.tp={tp} must divide module.heads=4 and module.block_size=16 ")
    assert message.endswith("allowed tp: 1, 2, 4")


def test_sequence_parallel_needs_the_degree_to_divide_the_block():
    """Sequence parallel shards the sequence evenly (gloo's reduce-scatter takes equal shards)."""
    with pytest.raises(ValueError, match=r"^strategy\.tp=2 must divide module\.heads=4 and module\.block_size=15 "
                                         r".*allowed tp: 1$"):
        GPTModule(heads=4, width=32, block_size=15).check_tensor_parallel(2)


def test_llama_needs_the_degree_to_divide_the_key_value_heads_too():
    module = LlamaModule(heads=8, kv_heads=2, width=64, block_size=64)
    module.check_tensor_parallel(2)
    with pytest.raises(ValueError, match=r"^strategy\.tp=4 must divide module\.heads=8, module\.kv_heads=2 and "
                                         r"module\.block_size=64 .*allowed tp: 1, 2$"):
        module.check_tensor_parallel(4)
    LlamaModule(heads=8, kv_heads=None, width=64, block_size=64).check_tensor_parallel(8)  # multi-head: kv_heads = heads


# ----- the plans -------------------------------------------------------------------------------------
@pytest.mark.parametrize("build", [gpt_module, llama_module])
def test_every_linear_and_norm_of_the_model_is_in_the_plan(build):
    """The plan names only existing submodules (expand_plan refuses others) and leaves no weight
    replicated that tensor parallel should split or sequence parallel should run on."""
    module = build()
    plan = expand_plan(module, module_plan(module))
    for name, submodule in module.named_modules():
        if isinstance(submodule, (torch.nn.Linear, torch.nn.Embedding, torch.nn.LayerNorm, torch.nn.RMSNorm)):
            assert name in plan, f"{name} ({type(submodule).__name__}) has no style in the plan"


@pytest.mark.parametrize("build, head", [(gpt_module, "model.head"), (llama_module, "model.output")])
@pytest.mark.parametrize("loss_parallel", [True, False])
def test_the_head_follows_the_strategys_loss_parallel_flag(build, head, loss_parallel):
    module = build()
    module._trainer = SimpleNamespace(strategy=SimpleNamespace(loss_parallel=loss_parallel))
    style = module.tensor_parallel_plan()[head]
    assert isinstance(style, ColwiseParallel)
    assert style.input_layouts == (Shard(1),)
    assert style.output_layouts == ((Shard(-1),) if loss_parallel else (Replicate(),))
    assert style.use_local_output is (not loss_parallel)


def test_outside_a_run_the_plan_uses_loss_parallel():
    assert gpt_module().tensor_parallel_plan()["model.head"].output_layouts == (Shard(-1),)


def test_a_loss_parallel_flag_that_is_not_a_bool_is_refused():
    module = gpt_module()
    module._trainer = SimpleNamespace(strategy=SimpleNamespace(loss_parallel="yes"))
    with pytest.raises(ValueError, match=r"strategy\.loss_parallel='yes' must be true or false"):
        module.tensor_parallel_plan()


# ----- gpt's older fused qkv checkpoints --------------------------------------------------------------
def fused_state_dict(module: GPTModule) -> dict[str, torch.Tensor]:
    """``module``'s weights in the older layout: each attention's q, k, v as one ``qkv`` (rows q, k, v)."""
    state = dict(module.state_dict())
    for i in range(module.model_args["layers"]):
        prefix = f"model.blocks.{i}.attention."
        for kind in ("weight", "bias"):
            state[f"{prefix}qkv.{kind}"] = torch.cat([state.pop(f"{prefix}{name}.{kind}") for name in "qkv"])
    return state


def fused_forward(module: GPTModule, state: dict[str, torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
    """The older gpt's forward (fused qkv, split after the projection) on ``state``: the reference."""
    def weight(name):
        return state[f"model.{name}"]

    x = F.embedding(tokens, weight("token_embedding.weight")) + weight("position_embedding.weight")[:tokens.shape[1]]
    heads = module.model_args["heads"]
    for i in range(module.model_args["layers"]):
        block = f"blocks.{i}."
        h = F.layer_norm(x, x.shape[-1:], weight(block + "norm1.weight"), weight(block + "norm1.bias"))
        batch, time, width = h.shape
        q, k, v = F.linear(h, weight(block + "attention.qkv.weight"), weight(block + "attention.qkv.bias")).split(width, -1)
        q, k, v = (t.view(batch, time, heads, width // heads).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(batch, time, width)
        x = x + F.linear(out, weight(block + "attention.proj.weight"), weight(block + "attention.proj.bias"))
        h = F.layer_norm(x, x.shape[-1:], weight(block + "norm2.weight"), weight(block + "norm2.bias"))
        h = F.linear(F.gelu(F.linear(h, weight(block + "mlp.0.weight"), weight(block + "mlp.0.bias"))),
                     weight(block + "mlp.2.weight"), weight(block + "mlp.2.bias"))
        x = x + h
    x = F.layer_norm(x, x.shape[-1:], weight("norm.weight"), weight("norm.bias"))
    return F.linear(x, weight("head.weight"))


def test_an_older_fused_qkv_state_dict_loads_into_the_split_projections():
    torch.manual_seed(0)
    old = fused_state_dict(gpt_module())
    assert any(k.endswith("attention.qkv.weight") for k in old) and not any(k.endswith("attention.q.weight") for k in old)
    module = gpt_module()
    module.load_state_dict(dict(old), strict=True)
    tokens = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(module.model(tokens), fused_forward(module, old, tokens), rtol=1e-6, atol=1e-6)
    width = module.model_args["width"]
    attention = module.model.blocks[1].attention
    torch.testing.assert_close(attention.v.weight, old["model.blocks.1.attention.qkv.weight"][2 * width:], rtol=0, atol=0)
    torch.testing.assert_close(attention.k.bias, old["model.blocks.1.attention.qkv.bias"][width:2 * width], rtol=0, atol=0)


def test_load_from_checkpoint_reads_an_older_gpt_checkpoint(tmp_path):
    torch.manual_seed(0)
    saved = gpt_module(vocab=256)  # the byte text's vocabulary, which load_from_checkpoint's build reads
    old = fused_state_dict(saved)
    path = tmp_path / "old_gpt.pt"
    torch.save({"model": old}, path)
    loaded = GPTModule.load_from_checkpoint(str(path), map_location="cpu", block_size=16, layers=2, heads=4, width=32,
                                            max_bytes=4096)
    for name, value in saved.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], value, rtol=0, atol=0, msg=f"{name} differs")


def test_init_from_an_older_gpt_checkpoint_starts_where_the_same_weights_in_the_new_layout_do(tmp_path):
    """``trainer.init_from`` checks the file's names before loading: the older layout's are renamed
    first, so both files start the same training (bitwise: the same weights, the same run)."""
    from tests.support.helpers import run_trainer, train_losses

    torch.manual_seed(0)
    saved = gpt_module(vocab=256)
    torch.save({"model": fused_state_dict(saved)}, tmp_path / "old.pt")
    torch.save(saved.state_dict(), tmp_path / "new.pt")
    losses = {}
    for name in ("old", "new"):
        module = GPTModule(optimizer=functools.partial(torch.optim.SGD, lr=0.1), max_bytes=20_000, block_size=16,
                           layers=2, heads=4, width=32)
        run_trainer(tmp_path / name, module, max_steps=2, batch_size=4, init_from=str(tmp_path / f"{name}.pt"))
        losses[name] = train_losses(str(tmp_path / name))
    assert len(losses["old"]) == 2
    assert losses["old"] == losses["new"]
