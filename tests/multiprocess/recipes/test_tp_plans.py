"""The gpt and llama recipes' tensor-parallel plans on 2 CPU ranks (gloo) == one process.

Each rank builds the recipe's model from the same seed as the one-process reference, applies the
recipe's own plan (``tensor_parallel_plan()``, expanded and applied by
``trainer/strategies/tensor_parallel.py`` over a 1-D ``tp`` mesh of 2), and runs the same batch:
forward and backward inside ``loss_parallel()`` (the strategy's default), then a few SGD steps.
Every rank sees the whole batch (tensor-parallel ranks of one replica do); the plan splits the heads,
the MLP width and the vocabulary, and shards the residual stream along the sequence.

Compared with the one-process run: the loss, every parameter's gradient (``full_tensor()`` of the
DTensor shards) and, after ``STEPS`` optimizer steps, every loss and parameter, and an evaluation loss computed outside ``loss_parallel()``. Tolerance: rtol 1e-5,
atol 1e-7 (fp32; the only differences are the order of the sums the row-split projections and the
vocabulary-sharded softmax reduce over two ranks). SGD, not Adam (see ``run``). The negative control
(gpt's older fused qkv projection, split by columns as one matrix) shows the comparison can fail.

Then the same recipes through ``Trainer(strategy="nd")`` (TP 2, FSDP 2 x TP 2, meta-device builds,
loss parallel off) and ``train.py``, each against one process over 15 steps (tolerance below).
"""

from __future__ import annotations

import os
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from trainer.runtime.launch import spawn

WORLD = 2
STEPS = 3
TIMEOUT = timedelta(seconds=120)
TOL = dict(rtol=1e-5, atol=1e-7)
VOCAB = 64
BATCH, TIME = 4, 16

#: (recipe, loss parallel, vocabulary) cases; llama's kv_heads 2 of heads 4: grouped-query attention on
#: the shards; a vocabulary of 65: shards of 33 and 32 rows (embedding) and logits.
CASES = {
    "gpt": ("gpt", True, 64),
    "llama": ("llama", True, 64),
    "llama_uneven_vocabulary": ("llama", True, 65),
    "gpt_gathered_logits": ("gpt", False, 64),
    "llama_gathered_logits": ("llama", False, 64),
}


def build(recipe: str, loss_parallel: bool, vocab: int = VOCAB):
    """The recipe's TrainModule with its model built from seed 0 (no data read: the vocabulary is given)."""
    from trainer.recipes.gpt import GPT, GPTModule
    from trainer.recipes.llama import Llama, LlamaModule

    torch.manual_seed(0)
    if recipe == "gpt":
        module = GPTModule(block_size=TIME, layers=2, heads=4, width=32)
        module.model = GPT(vocab_size=vocab, **module.model_args)
    else:
        module = LlamaModule(block_size=TIME, layers=2, heads=4, kv_heads=2, width=32, ffn_multiple_of=16)
        module.model = Llama(vocab_size=vocab, **module.model_args)
    # The strategy's flag, as the plan reads it (tp_plans.loss_parallel_enabled).
    module._trainer = SimpleNamespace(strategy=SimpleNamespace(loss_parallel=loss_parallel))
    return module


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [(torch.randint(0, VOCAB, (BATCH, TIME), generator=generator),
             torch.randint(0, VOCAB, (BATCH, TIME), generator=generator)) for _ in range(STEPS)]


def full(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def run(module, loss_parallel: bool) -> dict:
    """One forward + backward (its loss and gradients), then ``STEPS`` SGD steps (their losses, the
    parameters). SGD with momentum, not Adam: Adam divides each element by its own gradient's size,
    so an element whose gradient is ~1e-8 turns a summation-order difference into a visible step."""
    from contextlib import nullcontext

    from torch.distributed.tensor.parallel import loss_parallel as loss_parallel_context

    context = loss_parallel_context if loss_parallel and dist.is_initialized() else nullcontext
    optimizer = torch.optim.SGD(module.parameters(), lr=0.5, momentum=0.9)
    losses, grads = [], None
    for batch in batches():
        with context():
            loss, _ = module._loss(batch)
            assert not hasattr(loss, "placements"), "the recipe's loss must be a plain tensor"
            loss.backward()
        if grads is None:
            grads = {name: full(p.grad).clone() for name, p in module.named_parameters()}
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    params = {name: full(p.detach()).clone() for name, p in module.named_parameters()}
    module.eval()
    with torch.no_grad():  # an evaluation outside loss_parallel(): the recipe's loss still works
        eval_loss, _ = module._loss(batches()[0])
    return {"losses": torch.stack(losses), "grads": grads, "params": params, "eval_loss": eval_loss}


class FusedQKV(torch.nn.Module):
    """The negative control: gpt's attention with q, k and v in one fused projection (its older
    layout), the same function as the recipe's in one process."""

    def __init__(self, attention):
        super().__init__()
        self.head_dim, self.proj = attention.head_dim, attention.proj
        width = attention.q.in_features
        self.qkv = torch.nn.Linear(width, 3 * width)
        with torch.no_grad():
            self.qkv.weight.copy_(torch.cat([attention.q.weight, attention.k.weight, attention.v.weight]))
            self.qkv.bias.copy_(torch.cat([attention.q.bias, attention.k.bias, attention.v.bias]))

    def forward(self, x):
        batch, time, _ = x.shape
        q, k, v = (t.reshape(batch, time, -1, self.head_dim).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, time, -1))


def fused_qkv_loss(mesh) -> torch.Tensor:
    """The first loss of gpt with a fused qkv projection split by columns over ``mesh``, as a plan
    that treats it like separate q, k, v would: rank 0 gets all of q and half of k."""
    from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel

    from trainer.strategies.tensor_parallel import apply_plan, expand_plan

    module = build("gpt", True)
    for block in module.model.blocks:
        block.attention = FusedQKV(block.attention)
    plan = {key: style for key, style in module.tensor_parallel_plan().items()
            if not key.endswith(("attention.q", "attention.k", "attention.v"))}
    plan["model.blocks.*.attention.qkv"] = ColwiseParallel()
    apply_plan(module, expand_plan(module, plan), mesh)
    with loss_parallel():
        return module._loss(batches()[0])[0].detach()


def worker(path: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from trainer.strategies.tensor_parallel import apply_plan, expand_plan, module_plan

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=TIMEOUT)
    try:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        results = {}
        for name, (recipe, loss_parallel, vocab) in CASES.items():
            module = build(recipe, loss_parallel, vocab)
            apply_plan(module, expand_plan(module, module_plan(module)), mesh)
            results[name] = run(module, loss_parallel)
        results["fused_qkv_loss"] = fused_qkv_loss(mesh)
        if rank == 0:
            torch.save(results, path)
    finally:
        dist.barrier()
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> dict:
    """Rank 0's results of every case (one spawn of 2 workers for the whole file)."""
    path = str(tmp_path_factory.mktemp("tp_plans") / "rank0.pt")
    spawn(worker, (path,), nprocs=WORLD, timeout=TIMEOUT)
    return torch.load(path)


@pytest.mark.parametrize("name", list(CASES))
def test_tensor_parallel_plan_trains_as_one_process(ranks, name):
    recipe, loss_parallel, vocab = CASES[name]
    reference = run(build(recipe, loss_parallel, vocab), loss_parallel)
    result = ranks[name]
    torch.testing.assert_close(result["losses"][0], reference["losses"][0], **TOL)
    assert result["grads"].keys() == reference["grads"].keys()
    for param, grad in reference["grads"].items():
        torch.testing.assert_close(result["grads"][param], grad, **TOL, msg=lambda detail: f"{name}: gradient of {param}: {detail}")
    torch.testing.assert_close(result["losses"], reference["losses"], **TOL)
    torch.testing.assert_close(result["eval_loss"], reference["eval_loss"], **TOL)
    for param, value in reference["params"].items():
        torch.testing.assert_close(result["params"][param], value, **TOL, msg=lambda detail: f"{name}: {param} after {STEPS} steps: {detail}")


def test_negative_control_a_fused_qkv_split_by_columns_differs(ranks):
    """Split as one matrix, the fused projection gives each rank the wrong heads: the loss differs
    from the one process's by far more than the tolerance (the comparisons above can fail)."""
    reference = run(build("gpt", True), True)["losses"][0]
    assert abs(float(ranks["fused_qkv_loss"] - reference)) > 1e-4


# ----- through the Trainer: strategy=nd ---------------------------------------------------------------
#: CPU fp32 over 15 steps: rtol 1e-5 / atol 1e-6 (measured: losses within 1.6e-7 relative, validation
#: within 3e-8). SGD with momentum, not AdamW: gpt's key bias has no gradient in exact arithmetic (a
#: constant added to every key shifts each query's scores equally, which the softmax ignores), only
#: rounding noise, and AdamW divides that noise by its own size into steps of ~lr, different in any
#: two summation orders. lr 0.05: at 0.3 llama's updates grow large enough that 15 steps amplify
#: the summation-order differences past 1e-5 even between one process and plain FSDP on 2 ranks.
TRAINER_TOL = dict(rtol=1e-5, atol=1e-6)
TRAINER_STEPS = 15
GLOBAL_BATCH = 8


def recipe_module(recipe: str):
    """The recipe's module, tiny, on the byte text (the data every rank reads the same)."""
    import functools

    from trainer.recipes.gpt import GPTModule
    from trainer.recipes.llama import LlamaModule

    common = dict(optimizer=functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9), max_bytes=40_000, block_size=16,
                  layers=2, width=32, heads=4)
    return GPTModule(**common) if recipe == "gpt" else LlamaModule(kv_heads=2, ffn_multiple_of=16, **common)


def fit_recipe(path, recipe: str, **options) -> tuple[list[float], dict]:
    """Per-step losses, the last validation loss, and the final weights (full tensors: the Trainer
    returns a spawned run's weights into the caller's module)."""
    from tests.support.helpers import read_metrics, run_trainer

    module = recipe_module(recipe)
    run_trainer(path, module, max_steps=TRAINER_STEPS, val_every_n_steps=TRAINER_STEPS, **options)
    rows = read_metrics(str(path))
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    val = [r["val/loss"] for r in rows if "val/loss" in r]
    return (losses, {k: v.detach().clone() for k, v in module.state_dict().items()}), val


@pytest.fixture(scope="module", params=["gpt", "llama"])
def one_process(request, tmp_path_factory):
    recipe = request.param
    return recipe, fit_recipe(tmp_path_factory.mktemp(f"{recipe}_single"), recipe, batch_size=GLOBAL_BATCH)


def check_same_training(result, reference) -> None:
    from tests.support.same_training import assert_same_training

    (run, val), (reference_run, reference_val) = result, reference
    assert_same_training(run, reference_run, steps=TRAINER_STEPS, tol=TRAINER_TOL)
    assert len(val) == len(reference_val) == 1
    torch.testing.assert_close(torch.tensor(val), torch.tensor(reference_val), **TRAINER_TOL)


def test_nd_tp2_trains_the_recipe_as_one_process(one_process, tmp_path):
    from trainer.strategies.nd import NDStrategy

    recipe, reference = one_process
    result = fit_recipe(tmp_path, recipe, strategy=NDStrategy(tp=2), devices=2, batch_size=GLOBAL_BATCH)
    check_same_training(result, reference)


def test_nd_tp2_without_loss_parallel_trains_the_recipe_as_one_process(one_process, tmp_path):
    # strategy.loss_parallel=false: the plan's head gathers the logits into a plain tensor.
    from trainer.strategies.nd import NDStrategy

    recipe, reference = one_process
    result = fit_recipe(tmp_path, recipe, strategy=NDStrategy(tp=2, loss_parallel=False), devices=2,
                        batch_size=GLOBAL_BATCH)
    check_same_training(result, reference)


@pytest.mark.slow
def test_nd_fsdp2_x_tp2_trains_the_recipe_as_one_process(one_process, tmp_path):
    from trainer.strategies.nd import NDStrategy

    recipe, reference = one_process
    result = fit_recipe(tmp_path, recipe, strategy=NDStrategy(dp_shard=2, tp=2), devices=4,
                        batch_size=GLOBAL_BATCH // 2)
    check_same_training(result, reference)


@pytest.mark.slow
def test_nd_meta_init_fsdp2_x_tp2_trains_the_recipe_as_one_process(one_process, tmp_path):
    """Built on the meta device, each block materialised with the recipe's own initialisation, then
    split and sharded: the same weights, the same training."""
    from trainer.strategies.nd import NDStrategy

    recipe, reference = one_process
    result = fit_recipe(tmp_path, recipe, strategy=NDStrategy(dp_shard=2, tp=2, meta_init=True), devices=4,
                        batch_size=GLOBAL_BATCH // 2)
    check_same_training(result, reference)


@pytest.mark.slow
def test_nd_hsdp2x2_x_tp2_on_eight_ranks_trains_llama_as_one_process(tmp_path):
    """8 ranks: 2 replicas x 2 shards (HSDP) x 2 tensor-parallel ranks, the llama recipe (grouped-query
    attention, rotary embeddings) against one process on the same global batch of 8."""
    from trainer.strategies.nd import NDStrategy

    reference = fit_recipe(tmp_path / "single", "llama", batch_size=GLOBAL_BATCH)
    result = fit_recipe(tmp_path / "hsdp_tp", "llama", strategy=NDStrategy(dp_replicate=2, dp_shard=2, tp=2), devices=8,
                        batch_size=GLOBAL_BATCH // 4)
    check_same_training(result, reference)


# ----- through train.py ------------------------------------------------------------------------------
def test_train_py_runs_llama_with_tensor_parallel(tmp_path):
    from tests.support.command_line import TRAIN
    from tests.support.command_line import run as run_command
    from tests.support.helpers import read_metrics

    result = run_command(TRAIN + ["recipe=llama", "strategy=nd", "strategy.tp=2", "trainer.devices=2",
                                  "trainer.max_steps=10", "trainer.log_every_n_steps=5", "trainer.val_every_n_steps=10",
                                  "trainer.progress_bar=false", "module.max_bytes=100000", "checkpoint.save_last=false",
                                  "logger=[jsonl]", f"hydra.run.dir={tmp_path}"])
    assert result.returncode == 0, result.describe()
    rows = read_metrics(str(tmp_path))
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert len(losses) == 2 and losses[-1] < 0.9 * losses[0], losses
    assert [r["val/bits_per_byte"] for r in rows if "val/bits_per_byte" in r]
    assert "strategy nd: tp 2 = 2 ranks" in result.output


def test_train_py_refuses_a_degree_the_heads_cannot_take_in_one_line(tmp_path):
    from tests.support.command_line import TRAIN
    from tests.support.command_line import run as run_command

    result = run_command(TRAIN + ["recipe=llama", "strategy=nd", "strategy.tp=4", "trainer.devices=4",
                                  f"hydra.run.dir={tmp_path}"])
    assert result.returncode == 1, result.describe()
    assert result.stderr.strip() == ("error: strategy.tp=4 must divide module.heads=4, module.kv_heads=2 and "
                                     "module.block_size=64 (tensor parallel splits the attention heads, sequence "
                                     "parallel the sequence); allowed tp: 1, 2"), result.describe()
