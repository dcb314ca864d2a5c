"""Hugging Face models (tiny random Llama, GPT-2 and BERT built from transformers' own configs and
saved with save_pretrained) train on every layout as one process does on the same global batch.

Tolerance: CPU fp32, rtol=1e-5 / atol=1e-6 over 15 steps. DDP and FSDP sum the same gradients in
another order; tensor parallel sums the row-split matmuls' partial products in another order (an
all-reduce of two halves): the last bits only. The Llama layouts train with AdamW (the recipes'
default) at 1e-3: its division by each gradient's running RMS scales a last-bit difference of a
gradient that is a near-cancelling sum up with the rate, and at 1e-3 the largest difference measured
was under a tenth of the tolerance (FSDP 2 x TP 2); the command line runs the recipe's own AdamW
(3e-4, warm-up then cosine); GPT-2 and BERT train with SGD with momentum (tests/support/hf_models.py
``sgd``).
"""

from __future__ import annotations

import pytest
import torch

from tests.support.helpers import fit
from tests.support.hf_models import (TinyClassifier, TinyCausalLM, adamw, bert_config, gpt2_config, llama_config,
                                     save_model)
from tests.support.same_training import assert_same_training
from trainer.strategies.fsdp import FSDPStrategy
from trainer.strategies.nd import NDStrategy

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]
TOL = dict(rtol=1e-5, atol=1e-6)
STEPS = 15
GLOBAL_BATCH = 8


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_model(tmp_path_factory.mktemp("llama"), llama_config())


@pytest.fixture(scope="module")
def llama_one_process(llama_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("llama-single")
    return fit(run_dir, TinyCausalLM(path=llama_dir, pretrained=False, optimizer=adamw()), strategy="single",
               devices=1, batch_size=GLOBAL_BATCH, max_steps=STEPS)


LAYOUTS = {
    "ddp2": lambda: ("ddp", 2),
    "fsdp2-full": lambda: (FSDPStrategy(sharding="full"), 2),
    "fsdp2-grad_op": lambda: (FSDPStrategy(sharding="grad_op"), 2),
    "tp2": lambda: (NDStrategy(tp=2), 2),
    "fsdp2-x-tp2": lambda: (NDStrategy(dp_shard=2, tp=2), 4),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_llama_equals_one_process(layout, llama_dir, llama_one_process, tmp_path):
    strategy, devices = LAYOUTS[layout]()
    data_parallel = devices // 2 if layout == "fsdp2-x-tp2" else (1 if layout == "tp2" else devices)
    result = fit(tmp_path, TinyCausalLM(path=llama_dir, pretrained=False, optimizer=adamw()), strategy=strategy,
                 devices=devices, batch_size=GLOBAL_BATCH // data_parallel, max_steps=STEPS)
    assert_same_training(result, llama_one_process, steps=STEPS, tol=TOL)
    losses = llama_one_process[0]
    assert losses[-1] < 0.97 * losses[0]  # it trained


@pytest.fixture(scope="module")
def gpt2_one_process(tmp_path_factory):
    return fit(tmp_path_factory.mktemp("gpt2-single"), TinyCausalLM(config=gpt2_config()), strategy="single",
               devices=1, batch_size=GLOBAL_BATCH, max_steps=STEPS)


DATA_PARALLEL = {  # GPT-2 and BERT declare no tensor-parallel plan: their layouts are the data-parallel ones
    "ddp2": lambda: "ddp",
    "fsdp2-full": lambda: FSDPStrategy(sharding="full"),
    "fsdp2-grad_op": lambda: FSDPStrategy(sharding="grad_op"),
}


@pytest.mark.parametrize("layout", list(DATA_PARALLEL))
def test_gpt2_with_tied_embeddings_equals_one_process(layout, gpt2_one_process, tmp_path):
    reference = gpt2_one_process
    result = fit(tmp_path / layout, TinyCausalLM(config=gpt2_config()), strategy=DATA_PARALLEL[layout](), devices=2,
                 batch_size=GLOBAL_BATCH // 2, max_steps=STEPS)
    assert_same_training(result, reference, steps=STEPS, tol=TOL)
    assert "model.lm_head.weight" in result[1]  # tied to the embedding: equal to it, and to one process's
    assert (result[1]["model.lm_head.weight"] == result[1]["model.transformer.wte.weight"]).all()


@pytest.fixture(scope="module")
def bert_one_process(tmp_path_factory):
    return fit(tmp_path_factory.mktemp("bert-single"), TinyClassifier(config=bert_config()), strategy="single",
               devices=1, batch_size=GLOBAL_BATCH, max_steps=STEPS)


@pytest.mark.parametrize("layout", list(DATA_PARALLEL))
def test_bert_classifier_equals_one_process(layout, bert_one_process, tmp_path):
    reference = bert_one_process
    # BERT declares no _no_split_modules: under FSDP its blocks are named.
    result = fit(tmp_path / layout, TinyClassifier(config=bert_config(), blocks=["BertLayer"]),
                 strategy=DATA_PARALLEL[layout](), devices=2, batch_size=GLOBAL_BATCH // 2, max_steps=STEPS)
    assert_same_training(result, reference, steps=STEPS, tol=TOL)


def _cli(model_dir, run_dir, *overrides):
    """recipe=hf_causal_lm through train.py with its own AdamW and warm-up-cosine schedule: (per-step
    losses, the final weights of its last checkpoint)."""
    from tests.support.command_line import TRAIN, assert_ok, run
    from tests.support.helpers import train_losses
    from trainer.checkpoint.consolidate import full_weights

    result = run(TRAIN + ["recipe=hf_causal_lm", f"model.path={model_dir}", "model.pretrained=false",
                          "module.max_bytes=20000", "data.block_size=16", f"trainer.max_steps={STEPS}",
                          "trainer.log_every_n_steps=1", "trainer.val_every_n_steps=null", "trainer.progress_bar=false",
                          "logger=[jsonl]", f"hydra.run.dir={run_dir}", *overrides], timeout=300)
    assert_ok(result)
    return train_losses(str(run_dir)), full_weights(str(run_dir / "checkpoints"))


@pytest.fixture(scope="module")
def cli_one_process(llama_dir, tmp_path_factory):
    return _cli(llama_dir, tmp_path_factory.mktemp("cli-single"), "data.batch_size=8")


CLI_LAYOUTS = {  # recipe=hf_causal_lm model.path=DIR, as a user types it (global batch 8 in every run)
    "ddp2": ["data.batch_size=4", "strategy=ddp", "trainer.devices=2"],
    "fsdp2-full": ["data.batch_size=4", "strategy=fsdp", "trainer.devices=2"],
    "fsdp2-grad_op": ["data.batch_size=4", "strategy=fsdp", "strategy.sharding=grad_op", "trainer.devices=2"],
    "tp2": ["data.batch_size=8", "strategy=nd", "strategy.tp=2", "trainer.devices=2"],  # the model's own plan
    "fsdp2-x-tp2": ["data.batch_size=4", "strategy=nd", "strategy.dp_shard=2", "strategy.tp=2", "trainer.devices=4"],
}


@pytest.mark.parametrize("layout", list(CLI_LAYOUTS))
def test_command_line_equals_one_process(layout, llama_dir, cli_one_process, tmp_path):
    result = _cli(llama_dir, tmp_path / layout, *CLI_LAYOUTS[layout])
    assert_same_training(result, cli_one_process, steps=STEPS, tol=TOL)
    assert cli_one_process[0][-1] < cli_one_process[0][0]  # it trained


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    return save_model(tmp_path_factory.mktemp("gpt2"), gpt2_config())


@pytest.fixture(scope="module")
def gpt2_cli_one_process(gpt2_dir, tmp_path_factory):
    return _cli(gpt2_dir, tmp_path_factory.mktemp("gpt2-cli-single"), "data.batch_size=8")


@pytest.mark.parametrize("layout", ["ddp2", "fsdp2-full", "fsdp2-grad_op"])
def test_gpt2_command_line_equals_one_process(layout, gpt2_dir, gpt2_cli_one_process, tmp_path):
    # recipe=hf_causal_lm with GPT-2's directory: its tied embedding and head, its own _no_split_modules
    result = _cli(gpt2_dir, tmp_path / layout, *CLI_LAYOUTS[layout])
    assert_same_training(result, gpt2_cli_one_process, steps=STEPS, tol=TOL)
    assert gpt2_cli_one_process[0][-1] < gpt2_cli_one_process[0][0]  # it trained
