"""bench/gpu_check.py (what bench/gpu_check.sh runs): without CUDA it says so, skips the CUDA-only
sections and writes its result file; every command it would run names what the page says it runs;
its readers of ``trainer estimate``'s table and of metrics.jsonl give the right numbers."""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

pytestmark = pytest.mark.timeout(300)


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "bench", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


gpu_check = _load("gpu_check")


def test_plumbing_mode_says_no_cuda_builds_every_command_and_writes_the_file(tmp_path, capsys, monkeypatch):
    import _results  # (bench/ is on the path once gpu_check is loaded)

    # the machine's description imports Lightning for its version: slow, and not what is tested here
    monkeypatch.setattr(_results, "machine", lambda: {"cpu_count": os.cpu_count(), "gpu": None})
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--plumbing", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "no CUDA" in printed or "CUDA present, but --plumbing" in printed
    result = json.loads(out.read_text())
    assert result["benchmark"] == "gpu_check" and result["settings"]["mode"] == "plumbing"
    sections = result["results"]
    assert list(sections) == list(gpu_check.SECTIONS)
    assert sections["gpu_tests"]["status"] == "skipped" and sections["gpu_tests"]["reason"] == "no CUDA"
    # the files with gpu-marked tests are found (the suite has some)
    assert any(path.startswith("tests/") for path in sections["gpu_tests"]["files"])
    assert sections["fp16"]["status"] == "skipped" and sections["fsdp_offload"]["status"] == "skipped"
    rows = sections["recipes"]["rows"]
    done = {(r["recipe"], r["contender"], r["variant"]) for r in rows if r["status"] == "ok"}
    assert done == {(recipe, "trainer", variant) for recipe in ("gpt", "llama") for variant in ("eager", "checkpointing")} | \
        {(recipe, "hand-written", "eager") for recipe in ("gpt", "llama")}
    trainer_rows = [r for r in rows if r["contender"] == "trainer" and r["status"] == "ok"]
    for row in trainer_rows:
        assert f"recipe={row['recipe']}" in row["command"] and "precision=bf16-mixed" in row["command"]
        assert "trainer.accelerator=cpu" in row["command"]
        assert ("trainer.activation_checkpointing=true" in row["command"]) == (row["variant"] == "checkpointing")
    assert [r["recipe"] for r in sections["estimate"]["rows"]] == ["gpt", "llama"]
    assert sections["estimate"]["rows"][0]["command"][:3] == ["-m", "trainer", "estimate"]
    assert sections["host_syncs"]["command"][-2:] == ["--syncs", "--dry"]


def test_cuda_sizes_are_about_a_billion_parameters_and_the_dry_ones_tiny():
    from trainer.recipes.gpt import GPT
    from trainer.recipes.llama import ffn_hidden_size

    big = gpu_check.SIZES[("gpt", True)]
    width, layers = big["width"], big["layers"]
    gpt_params = layers * 12 * width * width  # attention 4 w^2 + MLP 8 w^2 per block
    assert 0.5e9 <= gpt_params <= 1.0e9
    llama = gpu_check.SIZES[("llama", True)]
    head = llama["width"] // llama["heads"]
    attention = 2 * llama["width"] ** 2 + 2 * llama["width"] * llama["kv_heads"] * head
    ffn = 3 * llama["width"] * ffn_hidden_size(llama["width"], llama["ffn_multiple_of"], None)
    assert 0.5e9 <= llama["layers"] * (attention + ffn) <= 1.0e9
    tiny = gpu_check.SIZES[("gpt", False)]
    model = GPT(vocab_size=256, block_size=tiny["block_size"], layers=tiny["layers"], heads=tiny["heads"],
                width=tiny["width"], dropout=0.0)
    assert sum(p.numel() for p in model.parameters()) < 100_000


def test_estimate_total_is_read_from_the_configured_table():
    output = """GPTModule: 1,000 parameters; precision bf16-mixed
configured: single
        parameters  gradients  optimizer  buckets  activations      total  fits
------  ----------  ---------  ---------  -------  -----------  ---------  ----
rank 0    9.02 GiB   9.02 GiB  18.03 GiB      0 B    31.61 GiB  67.68 GiB   yes
"""
    assert gpu_check.estimate_total_gib(output) == pytest.approx(67.68)
    assert gpu_check.estimate_total_gib(output.replace("67.68 GiB", "512.00 MiB")) == pytest.approx(0.5)
    assert gpu_check.estimate_total_gib("no table") is None


def test_perf_is_read_from_the_last_logging_window(tmp_path):
    rows = [{"step": 10, "train/loss": 3.0, "perf/tokens_per_s": 100.0, "perf/mfu": 0.1},
            {"step": 20, "train/loss": 2.0, "perf/tokens_per_s": 300.0, "perf/mfu": 0.3, "memory/peak_allocated_gb": 7.5},
            {"step": 20, "val/loss": 2.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert gpu_check.perf_of(gpu_check.metrics_rows(str(tmp_path))) == {"tokens_per_s": 300.0, "mfu": 0.3,
                                                                         "peak_allocated_gb": 7.5}
    assert gpu_check.metrics_rows(str(tmp_path / "none")) == []
