"""Weights in and out of a Hugging Face directory.

In: ``trainer.init_from=DIR`` / a module whose ``path`` holds safetensors (here sharded, with an
index) starts from exactly those weights on every layout (one process, DDP 2, FSDP 2, TP 2, FSDP 2 x TP 2): the first step's loss is transformers' own
forward on the same batch (rtol 1e-5: the same fp32 model, its matmuls split differently). Under FSDP
each rank reads only its slices: the bytes it reads from the files (counted where torch's
HuggingFaceStorageReader copies each slice in, tests/support/hf_models.py FirstBatchLM) and the
bytes of the parameters it holds are each below one whole copy of the model, and its largest single
read is one tensor's slice.

Out: the trained model exported as a directory ``AutoModelForCausalLM.from_pretrained`` loads (at the
end of the run, and by ``trainer consolidate --format hf`` from a sharded FSDP x TP checkpoint and
from a full one) gives the trained module's logits (rtol 1e-5).
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch

from tests.support.command_line import REPO
from tests.support.helpers import fit
from tests.support.hf_models import FirstBatchLM, TinyCausalLM, llama_config, save_model
from trainer.strategies.fsdp import FSDPStrategy
from trainer.strategies.nd import NDStrategy

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]
TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory):
    # 3 files of about 20 KB and an index (model.safetensors.index.json)
    return save_model(tmp_path_factory.mktemp("llama-sharded"), llama_config(), seed=11, max_shard_size="20KB",
                      tokenizer=True)


def transformers_loss(directory, batch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory)
    with torch.no_grad():
        return float(model(input_ids=batch, labels=batch).loss)


def model_bytes(directory):
    with open(os.path.join(directory, "model.safetensors.index.json")) as f:
        return json.load(f)["metadata"]["total_size"]


LAYOUTS = {
    "single": lambda: ("single", 1, 1),
    "ddp2": lambda: ("ddp", 2, 2),
    "fsdp2": lambda: (FSDPStrategy(), 2, 2),
    "tp2": lambda: (NDStrategy(tp=2), 2, 1),
    "fsdp2-x-tp2": lambda: (NDStrategy(dp_shard=2, tp=2), 4, 2),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_starts_from_the_directorys_weights(layout, sharded_dir, tmp_path):
    assert len([f for f in os.listdir(sharded_dir) if f.endswith(".safetensors")]) > 1
    strategy, devices, data_parallel = LAYOUTS[layout]()
    module = FirstBatchLM(path=sharded_dir)
    losses, _ = fit(tmp_path, module, strategy=strategy, devices=devices, batch_size=8 // data_parallel, max_steps=1)
    expected = transformers_loss(sharded_dir, module.first_batch())
    torch.testing.assert_close(torch.tensor(losses[0]), torch.tensor(expected), **TOL)
    whole = model_bytes(sharded_dir)
    loads = [json.load(open(tmp_path / f"load_rank{r}.json")) for r in range(devices)]
    print(f"\n{layout}: model {whole} bytes; per rank {loads}")
    if layout in ("single", "ddp2"):  # each process holds a whole replica: it reads everything once
        assert [load["bytes_read"] for load in loads] == [whole] * devices
        return
    if layout == "tp2":  # the layers and the head split; the embedding and the norms (not in the plan) whole
        assert all(0 < load["bytes_read"] < whole for load in loads), (loads, whole)
        return
    for load in loads:  # no rank read, or holds, a whole copy
        assert 0 < load["bytes_read"] < 0.6 * whole, (load, whole)
        assert load["param_bytes"] < 0.6 * whole, (load, whole)
        assert load["largest_read"] <= 256 * 16 * 4  # at most one embedding / head matrix (vocab x width)


def test_init_from_a_directory_wins_over_random_weights(sharded_dir, tmp_path):
    module = FirstBatchLM(config=llama_config())  # random weights of its own, then init_from's
    losses, _ = fit(tmp_path, module, strategy="fsdp", devices=2, batch_size=4, max_steps=1, init_from=sharded_dir)
    expected = transformers_loss(sharded_dir, module.first_batch())
    torch.testing.assert_close(torch.tensor(losses[0]), torch.tensor(expected), **TOL)


def test_a_directory_that_does_not_fit_is_one_line(sharded_dir, tmp_path):
    from trainer.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match=r"does not fit .*missing \['model.layers.2"):
        fit(tmp_path, TinyCausalLM(config=llama_config(num_hidden_layers=3)), strategy="single", devices=1,
            batch_size=8, max_steps=1, init_from=sharded_dir)


def logits_of(directory, ids):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory)
    with torch.no_grad():
        return model(input_ids=ids).logits


def trained_logits(params, ids):
    module = TinyCausalLM(config=llama_config())
    module.configure_model()
    module.load_state_dict(params)
    with torch.no_grad():
        return module.model(input_ids=ids).logits


def consolidate_hf(checkpoints, out, model_dir):
    from trainer.cli.command import main

    assert main(["consolidate", str(checkpoints), str(out), "--format", "hf", "--model", model_dir]) == 0


@pytest.mark.parametrize("layout", ["fsdp2-x-tp2", "single-full"])
def test_exported_directory_gives_the_trained_logits(layout, sharded_dir, tmp_path):
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(4))
    export = tmp_path / "export"
    if layout == "fsdp2-x-tp2":
        strategy, devices, batch, checkpoint = NDStrategy(dp_shard=2, tp=2), 4, 4, dict(format="sharded")
    else:
        strategy, devices, batch, checkpoint = "single", 1, 8, dict(format="full")
    _, params = fit(tmp_path / "run", TinyCausalLM(path=sharded_dir, export_dir=str(export)), strategy=strategy,
                    devices=devices, batch_size=batch, max_steps=3, checkpoint=checkpoint)
    expected = trained_logits(params, ids)
    assert not torch.allclose(expected, logits_of(sharded_dir, ids))  # it trained away from the start
    consolidate_hf(tmp_path / "run" / "checkpoints", tmp_path / "consolidated", sharded_dir)
    for directory in (export, tmp_path / "consolidated"):
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(directory))
        torch.testing.assert_close(logits_of(str(directory), ids), expected, **TOL)


def test_consolidate_hf_without_a_model_directory_is_one_line(tmp_path):
    import subprocess

    done = subprocess.run([sys.executable, "-m", "trainer", "consolidate", str(tmp_path), str(tmp_path / "o"),
                           "--format", "hf", "--model", str(tmp_path / "nowhere")], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith("error: module.path=")
