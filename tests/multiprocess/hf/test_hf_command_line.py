"""Hugging Face models through the command line, as a user types them: ``recipe=hf_sequence_classification``
(a tiny random BERT saved locally) on DDP 2 and FSDP 2 (full and grad_op) trains as one process does on the same global batch, and every
wrong input ends with one line on stderr, exit status 1, before any worker starts.

Tolerance: CPU fp32, the recipe's own AdamW and warmup-cosine schedule, rtol=1e-5 / atol=1e-6 over 15 steps
(losses and the final weights of the last checkpoint). DDP sums the two halves' gradients in another order
than one process: the last bits only. BERT's embeddings of ids the data never hold have a zero gradient in
both runs, so Adam's division by a running RMS does not blow a last-bit difference up (the reason the Llama
tests use SGD: tests/support/hf_models.py ``sgd``).
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.support.command_line import TRAIN, assert_ok, run
from tests.support.helpers import train_losses
from tests.support.hf_models import bert_config, llama_config, save_model

pytestmark = [pytest.mark.timeout(400), pytest.mark.slow]
TOL = dict(rtol=1e-5, atol=1e-6)
STEPS = 15
QUIET = ["trainer.log_every_n_steps=1", "trainer.val_every_n_steps=null", "trainer.progress_bar=false",
         "logger=[jsonl]"]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    return save_model(tmp_path_factory.mktemp("bert"), bert_config(), auto="AutoModelForSequenceClassification")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_model(tmp_path_factory.mktemp("llama"), llama_config())


def _classify(bert_dir, run_dir, *overrides):
    from trainer.checkpoint.consolidate import full_weights

    result = run(TRAIN + ["recipe=hf_sequence_classification", f"model.path={bert_dir}", f"trainer.max_steps={STEPS}",
                          "module.num_samples=128", "module.val_samples=0", *QUIET, f"hydra.run.dir={run_dir}",
                          *overrides], timeout=300)
    assert_ok(result)
    return train_losses(str(run_dir)), full_weights(str(run_dir / "checkpoints"))


@pytest.fixture(scope="module")
def bert_one_process(bert_dir, tmp_path_factory):
    return _classify(bert_dir, tmp_path_factory.mktemp("bert-single"), "data.batch_size=16")


LAYOUTS = {  # global batch 16 in every run; BERT declares no _no_split_modules: under FSDP its blocks are named
    "ddp2": ["data.batch_size=8", "strategy=ddp", "trainer.devices=2"],
    "fsdp2-full": ["data.batch_size=8", "strategy=fsdp", "trainer.devices=2", "model.blocks=[BertLayer]"],
    "fsdp2-grad_op": ["data.batch_size=8", "strategy=fsdp", "strategy.sharding=grad_op", "trainer.devices=2",
                      "model.blocks=[BertLayer]"],
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_bert_classifier_equals_one_process(layout, bert_dir, bert_one_process, tmp_path):
    from tests.support.same_training import assert_same_training

    result = _classify(bert_dir, tmp_path / layout, *LAYOUTS[layout])
    assert_same_training(result, bert_one_process, steps=STEPS, tol=TOL)
    assert "model.classifier.weight" in bert_one_process[1]
    losses = bert_one_process[0]
    assert losses[-1] < losses[0]  # it trained


REFUSALS = {
    "pipeline": (["recipe=hf_causal_lm", "model.path={llama}", "strategy=pipeline", "trainer.devices=2"],
                 r"error: strategy=pipeline \(or strategy.pp > 1\) cannot cut LlamaForCausalLM into stages: .*; "
                 r"allowed: strategy=single, ddp, fsdp or nd with pp=1"),
    "hub-name": (["recipe=hf_causal_lm", "model.path=meta-llama/Llama-3.2-1B", "strategy=ddp", "trainer.devices=2"],
                 r"error: module.path='meta-llama/Llama-3.2-1B' is not a local directory; models are not downloaded "
                 r"at run time: .* pass its local directory"),
    "no-config": (["recipe=hf_causal_lm", "model.path={empty}", "strategy=ddp", "trainer.devices=2"],
                  r"error: module.path='.*' has no config.json; pass a directory written by save_pretrained"),
    "no-weights": (["recipe=hf_causal_lm", "model.path={llama}", "trainer.init_from={config_only}", "strategy=ddp",
                    "trainer.devices=2"],
                   r"error: trainer.init_from='.*' is neither a file of weights nor a directory of safetensors"),
    "no-split-modules": (["recipe=hf_sequence_classification", "model.path={bert}", "strategy=fsdp",
                          "trainer.devices=2"],
                         r"error: BertForSequenceClassification declares no _no_split_modules, so FSDP cannot find "
                         r"its blocks; pass its block class names as blocks=\[...\] \(model.blocks=\[...\]"),
    "plan-name": (["recipe=hf_causal_lm", "model.path={llama}", "strategy=nd", "strategy.tp=2", "trainer.devices=2",
                   "model.tp_plan={model.model.layers.*.self_attn.q_prj:colwise}"],
                  r"error: .*names 'model.model.layers.\*.self_attn.q_prj', which is no submodule of the model; "
                  r"did you mean"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_wrong_input_is_one_line_before_any_worker(case, llama_dir, bert_dir, tmp_path):
    import re

    (tmp_path / "empty").mkdir()
    config_only = tmp_path / "config-only"
    llama_config().save_pretrained(str(config_only))
    where = dict(llama=llama_dir, bert=bert_dir, empty=tmp_path / "empty", config_only=config_only)
    overrides, expected = REFUSALS[case]
    for name, value in where.items():
        overrides = [o.replace("{" + name + "}", str(value)) for o in overrides]
    result = run(TRAIN + overrides + [f"hydra.run.dir={tmp_path / 'run'}"])
    assert result.returncode == 1, result.describe()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(expected + ".*", lines[0]), result.describe()
    assert not os.path.exists(tmp_path / "run" / "metrics.jsonl")  # no worker ran a step
    assert "rank 0 failed" not in result.output
