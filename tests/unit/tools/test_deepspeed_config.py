"""DeepSpeed JSON import: every mapped key, DeepSpeed 0.19's defaults, the
precedence (JSON over the composed config, typed overrides over the JSON), the warning and the errors;
and the example configs (docs/examples/deepspeed) through ``train.py`` on 2 CPU ranks. The schedulers against
DeepSpeed's formulas: test_deepspeed_schedulers.py."""

from __future__ import annotations

import json
import logging
import math
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from tests.support.helpers import REPO, read_metrics
from tests.support.command_line import FAST, Started
from trainer.deepspeed_config import apply_json, from_deepspeed_config

pytestmark = pytest.mark.timeout(240)
EXAMPLES = Path(REPO) / "docs" / "examples" / "deepspeed"
#: rejected on any world size: 30 is not micro x accumulation x world
INCONSISTENT = {"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4,
                "optimizer": {"type": "SGD", "params": {"lr": 0.01}}}
MLP = ["recipe=mlp"]


def composed(overrides: list[str]):
    with initialize_config_dir(os.path.join(REPO, "conf"), version_base="1.3"):
        return compose("config", overrides=overrides)


def imported(tmp_path, data: dict, overrides: list[str] = MLP):
    """The composed config for ``overrides`` with ``data`` (a DeepSpeed config) applied, as train.py does."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(data))
    cfg = composed(overrides)
    apply_json(cfg, str(path), overrides)
    return cfg


def error_of(tmp_path, data: dict, overrides: list[str] = MLP) -> str:
    with pytest.raises(ValueError) as caught:
        imported(tmp_path, data, overrides)
    return str(caught.value)


# ----- batch keys ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("given, devices, expected", [
    ({"train_batch_size": 32, "gradient_accumulation_steps": 2}, 2, (8, 2, 32)),
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 2, (4, 4, 32)),
    ({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3}, 2, (2, 3, 12)),
    ({"train_batch_size": 16}, 4, (4, 1, 16)),
    ({"train_micro_batch_size_per_gpu": 3}, 2, (3, 1, 6)),
    ({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}, 2, (2, 2, 8)),
])
def test_batch_keys_derive_the_missing_one_as_deepspeed(tmp_path, given, devices, expected):
    cfg = imported(tmp_path, given, MLP + [f"trainer.devices={devices}"])
    assert (cfg.data.batch_size, cfg.trainer.accumulate_grad_batches, cfg.data.global_batch_size) == expected


@pytest.mark.parametrize("given, devices, parts", [
    ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4}, 2,
     ["train_batch_size=30", "train_micro_batch_size_per_gpu=4", "gradient_accumulation_steps=4", "world size 2"]),
    ({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}, 1,
     ["implies world size 2", "world size 1 (trainer.devices x trainer.num_nodes = 1 x 1)"]),
    ({"train_batch_size": 32, "gradient_accumulation_steps": 3}, 2, ["do not fit world size 2", "32 != 5 x 3 x 2"]),
    ({"gradient_accumulation_steps": 3}, 1, ["give train_batch_size or train_micro_batch_size_per_gpu"]),
    ({"train_batch_size": 0}, 1, ["train_batch_size must be an integer >= 1, got 0"]),
])
def test_inconsistent_batch_keys_are_an_error_naming_them(tmp_path, given, devices, parts):
    message = error_of(tmp_path, given, MLP + [f"trainer.devices={devices}"])
    assert all(part in message for part in parts), message


# ----- defaults of omitted keys, and each mapping ------------------------------------------------------
def test_omitted_keys_take_deepspeeds_defaults(tmp_path):
    cfg = imported(tmp_path, {"train_batch_size": 4})
    assert cfg.precision.name == "fp32"  # neither fp16 nor bf16 enabled
    assert cfg.trainer.gradient_clip_val == 1.0  # DeepSpeed 0.19's gradient_clipping default
    assert cfg.strategy._target_.endswith("DDPStrategy") and cfg.strategy.zero1 is False  # stage 0
    assert cfg.trainer.profile.wall_clock_breakdown is False and cfg.trainer.activation_checkpointing is False
    assert list(cfg.logger) == ["jsonl"]  # no monitor enabled: the default tensorboard goes, jsonl stays
    # No optimizer / scheduler block: DeepSpeed keeps the client's, here the composed groups (the recipe's SGD).
    assert cfg.optimizer._target_ == "torch.optim.SGD" and cfg.scheduler is None
    assert cfg.trainer.log_every_n_steps == 10  # no steps_per_print: our logging cadence stays


def test_fp16_maps_onto_the_loss_scaler(tmp_path):
    fp16 = {"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 500, "hysteresis": 3,
            "min_loss_scale": 2, "consecutive_hysteresis": True}
    scaler = instantiate(imported(tmp_path, {"train_batch_size": 4, "fp16": fp16}).precision).scaler
    assert (scaler.scale, scaler.loss_scale_window, scaler.hysteresis, scaler.min_loss_scale) == (2.0**12, 500, 3, 2.0)
    assert scaler.consecutive_hysteresis and scaler.dynamic
    defaults = instantiate(imported(tmp_path, {"train_batch_size": 4, "fp16": {"enabled": True}}).precision)
    assert defaults.name == "fp16-mixed" and defaults.scaler.scale == 2.0**16
    assert (defaults.scaler.loss_scale_window, defaults.scaler.hysteresis, defaults.scaler.min_loss_scale) == (1000, 2, 1.0)
    static = instantiate(imported(tmp_path, {"train_batch_size": 4, "fp16": {"enabled": True, "loss_scale": 128}}).precision)
    assert not static.scaler.dynamic and static.scaler.scale == 128.0


def test_bf16_and_the_fp16_bf16_conflict(tmp_path):
    assert imported(tmp_path, {"train_batch_size": 4, "bf16": {"enabled": True}}).precision.name == "bf16-mixed"
    assert imported(tmp_path, {"train_batch_size": 4, "bfloat16": {"enabled": True}}).precision.name == "bf16-mixed"
    assert "fp16.enabled and bf16.enabled are both true" in error_of(
        tmp_path, {"train_batch_size": 4, "bf16": {"enabled": True}, "fp16": {"enabled": True}})


@pytest.mark.parametrize("zero, target, settings", [
    ({"stage": 0}, "DDPStrategy", {"zero1": False}),
    ({"stage": 1}, "DDPStrategy", {"zero1": True}),
    ({"stage": 2}, "FSDPStrategy", {"sharding": "grad_op", "cpu_offload": False}),
    ({"stage": 3}, "FSDPStrategy", {"sharding": "full", "cpu_offload": False}),
    ({"stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}, "FSDPStrategy",
     {"sharding": "full", "cpu_offload": True}),
])
def test_zero_stage_picks_the_strategy(tmp_path, zero, target, settings):
    strategy = imported(tmp_path, {"train_batch_size": 4, "zero_optimization": zero}).strategy
    assert strategy._target_.endswith(target)
    assert {key: strategy[key] for key in settings} == settings


@pytest.mark.parametrize("zero, part", [
    ({"stage": 2, "offload_optimizer": {"device": "cpu"}}, 'add "offload_param": {"device": "cpu"} with stage 3'),
    ({"stage": 2, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}, "needs stage 3"),
    ({"stage": 3, "offload_param": {"device": "nvme"}}, "offload_param.device='nvme' is not supported"),
    ({"stage": 4}, "zero_optimization.stage must be an integer in [0, 3], got 4"),
])
def test_zero_errors(tmp_path, zero, part):
    assert part in error_of(tmp_path, {"train_batch_size": 4, "zero_optimization": zero})


def build_optimizer(tmp_path, optimizer: dict) -> torch.optim.Optimizer:
    node = imported(tmp_path, {"train_batch_size": 4, "optimizer": optimizer}).optimizer
    return instantiate(node)(torch.nn.Linear(2, 2).parameters())


@pytest.mark.parametrize("optimizer, cls, expected", [
    # Adam is AdamW (decoupled decay) unless adam_w_mode=false; FusedAdam's defaults (weight_decay 0).
    ({"type": "Adam", "params": {"lr": 0.01}}, torch.optim.AdamW,
     {"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}),
    ({"type": "adam", "params": {"adam_w_mode": False, "weight_decay": 0.1}}, torch.optim.Adam, {"weight_decay": 0.1}),
    ({"type": "AdamW", "params": {"adam_w_mode": False}}, torch.optim.AdamW, {"weight_decay": 0.0}),
    # torch_adam: DeepSpeed calls torch's class, whose defaults then hold (AdamW's weight_decay 0.01).
    ({"type": "Adam", "params": {"torch_adam": True}}, torch.optim.AdamW, {"weight_decay": 0.01}),
    ({"type": "SGD", "params": {"lr": 0.05, "momentum": 0.8}}, torch.optim.SGD, {"lr": 0.05, "momentum": 0.8}),
])
def test_optimizer_types_and_their_params(tmp_path, optimizer, cls, expected):
    built = build_optimizer(tmp_path, optimizer)
    assert type(built) is cls
    group = built.param_groups[0]
    assert {key: tuple(group[key]) if key == "betas" else group[key] for key in expected} == expected


@pytest.mark.parametrize("optimizer, part", [
    ({"type": "Lamb", "params": {}}, "optimizer.type='Lamb' (a DeepSpeed optimizer) is not supported"),
    ({"type": "sgd"}, "optimizer.type='sgd' is neither Adam / AdamW nor a torch.optim class"),
    ({"type": "Adam", "params": {"max_grad_norm": 1.0}}, "use gradient_clipping"),
    ({"type": "Adam", "params": {"bias_correction": False}}, "bias_correction=false is not supported"),
])
def test_optimizer_errors(tmp_path, optimizer, part):
    assert part in error_of(tmp_path, {"train_batch_size": 4, "optimizer": optimizer})


def test_scheduler_types(tmp_path):
    for kind in ("WarmupLR", "WarmupDecayLR", "WarmupCosineLR"):
        node = imported(tmp_path, {"train_batch_size": 4, "scheduler": {"type": kind, "params": {}}}).scheduler
        assert node._target_ == f"trainer.deepspeed_config.schedulers.{kind}"
    node = imported(tmp_path, {"train_batch_size": 4, "scheduler": {"type": "StepLR", "params": {"step_size": 3}}}).scheduler
    assert node._target_ == "torch.optim.lr_scheduler.StepLR" and node.step_size == 3
    assert "scheduler.type='OneCycle' is not supported" in error_of(
        tmp_path, {"train_batch_size": 4, "scheduler": {"type": "OneCycle", "params": {}}})


def test_run_level_keys(tmp_path, caplog):
    data = {"train_batch_size": 4, "gradient_clipping": 0.0, "steps_per_print": 7, "wall_clock_breakdown": True,
            "activation_checkpointing": {"partition_activations": True}, "dataloader_drop_last": True}
    with caplog.at_level(logging.WARNING, logger="trainer"):
        cfg = imported(tmp_path, data)
    assert cfg.trainer.gradient_clip_val is None  # 0 turns clipping off, as in DeepSpeed
    assert cfg.trainer.log_every_n_steps == 7 and cfg.trainer.profile.wall_clock_breakdown is True
    assert cfg.trainer.activation_checkpointing is True and cfg.data.drop_last is True
    assert "activation_checkpointing.partition_activations" in caplog.text
    assert imported(tmp_path, {"train_batch_size": 4, "gradient_clipping": 0.5}).trainer.gradient_clip_val == 0.5


def test_monitor_blocks_become_our_loggers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # output_path is relative to the directory the run starts in, as in DeepSpeed
    data = {"train_batch_size": 4, "tensorboard": {"enabled": True, "output_path": "out/", "job_name": "job"},
            "csv_monitor": {"enabled": True}, "wandb": {"enabled": True, "team": "t", "group": "g"}}
    logger = imported(tmp_path, data).logger
    assert list(logger) == ["jsonl", "tensorboard", "csv", "wandb"]
    assert logger.tensorboard.log_dir == str(tmp_path / "out" / "job") and logger.tensorboard.flush_secs == 30
    assert logger.csv.log_dir == str(tmp_path / "DeepSpeedJobName") and logger.csv.filename == "metrics.csv"
    assert (logger.wandb.project, logger.wandb.entity, logger.wandb.group) == ("deepspeed", "t", "g")
    # train.py passes the directory the run started in (hydra.runtime.cwd), also under hydra.job.chdir=true.
    cfg = composed(MLP)
    apply_json(cfg, str(tmp_path / "ds.json"), MLP, start_dir="/start")
    assert cfg.logger.tensorboard.log_dir == "/start/out/job"


# ----- unsupported keys: one warning (speed), an error (math) -------------------------------------------
def test_speed_only_keys_are_one_warning_listing_them(tmp_path, caplog):
    data = {"train_batch_size": 4, "prescale_gradients": True, "flops_profiler": {},
            "zero_optimization": {"stage": 2, "overlap_comm": True, "reduce_bucket_size": 5e8}}
    with caplog.at_level(logging.WARNING, logger="trainer"):
        imported(tmp_path, data)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    for key in ("prescale_gradients", "flops_profiler", "zero_optimization.overlap_comm",
                "zero_optimization.reduce_bucket_size"):
        assert key in warnings[0]


def test_keys_that_change_the_math_are_an_error_naming_them(tmp_path):
    data = {"train_batch_size": 4, "torch_autocast": {"enabled": True}, "not_a_key": 1,
            "zero_optimization": {"stage": 2, "zero_quantized_gradients": True},
            "fp16": {"enabled": True, "fp16_master_weights_and_grads": True}}
    message = error_of(tmp_path, data)
    for key in ("torch_autocast", "not_a_key", "zero_optimization.zero_quantized_gradients",
                "fp16.fp16_master_weights_and_grads"):
        assert key in message
    assert "\n" not in message


def test_file_errors(tmp_path):
    assert "gradient_clipping = \"auto\"" in error_of(tmp_path, {"train_batch_size": 4, "gradient_clipping": "auto"})
    bad = tmp_path / "dup.json"
    bad.write_text('{"train_batch_size": 4, "train_batch_size": 8}')
    with pytest.raises(ValueError, match="duplicate key"):
        apply_json(composed(MLP), str(bad))


# ----- precedence ----------------------------------------------------------------------------------------
def test_json_replaces_the_recipe_and_typed_overrides_win(tmp_path):
    data = {"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 0.3, "zero_optimization": {"stage": 1},
            "fp16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 0.002}},
            "tensorboard": {"enabled": True}}
    cfg = imported(tmp_path, data)
    assert cfg.data.batch_size == 4  # the recipe's 32 gives way to the JSON
    assert cfg.optimizer.lr == 0.002 and "momentum" not in cfg.optimizer  # the recipe's SGD node is replaced
    typed = MLP + ["optimizer.lr=0.5", "strategy=fsdp", "precision=bf16-mixed", "trainer.gradient_clip_val=2.0",
                   "logger=[jsonl]", "data.batch_size=2"]
    cfg = imported(tmp_path, data, typed)
    assert cfg.optimizer._target_ == "torch.optim.AdamW" and cfg.optimizer.lr == 0.5
    assert cfg.strategy._target_.endswith("FSDPStrategy") and cfg.strategy.sharding == "full"
    assert cfg.precision.name == "bf16-mixed" and cfg.trainer.gradient_clip_val == 2.0
    assert list(cfg.logger) == ["jsonl"] and cfg.data.batch_size == 2


def test_python_api(tmp_path):
    ds = from_deepspeed_config(_write(tmp_path, {
        "train_batch_size": 16, "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 2},
        "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}}}), devices=2)
    kwargs = ds.trainer_kwargs
    assert (kwargs["batch_size"], kwargs["accumulate_grad_batches"], kwargs["global_batch_size"]) == (4, 2, 16)
    assert type(kwargs["strategy"]).__name__ == "FSDPStrategy" and kwargs["strategy"].sharding == "grad_op"
    optimizer = ds.optimizer(torch.nn.Linear(2, 2).parameters())
    assert type(optimizer) is torch.optim.AdamW and type(ds.scheduler(optimizer)).__name__ == "WarmupLR"
    trainer = ds.trainer(max_steps=3, gradient_clip_val=None, run_dir=str(tmp_path / "run"))
    assert trainer.max_steps == 3 and trainer.gradient_clip_val is None and trainer.accumulate_grad_batches == 2


def _write(tmp_path, data: dict) -> str:
    path = tmp_path / "api.json"
    path.write_text(json.dumps(data))
    return str(path)


# ----- the example configs through train.py (3 spawned runs on 2 ranks, one failing before any worker) ------
@pytest.fixture(scope="module")
def example_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("deepspeed")
    (root / "inconsistent_batch.json").write_text(json.dumps(INCONSISTENT))
    train = [sys.executable, os.path.join(REPO, "train.py")] + FAST[:1] + ["trainer.max_steps=4",
                                                                            "trainer.progress_bar=false"]
    jobs = {
        "zero1": train + [f"+deepspeed_config={EXAMPLES / 'zero1_adamw_cosine.json'}", "trainer.devices=2",
                          "trainer.max_steps=10"],
        "zero3": train + [f"+deepspeed_config={EXAMPLES / 'zero3_bf16_monitors.json'}", "trainer.devices=2"],
        "zero2": train + [f"+deepspeed_config={EXAMPLES / 'zero2_fp16_adamw.json'}", "trainer.devices=2",
                          "trainer.log_every_n_steps=2"],
        "inconsistent": train + [f"+deepspeed_config={root / 'inconsistent_batch.json'}", "trainer.devices=2"],
    }

    def one(name):
        (root / name).mkdir()
        return name, Started(jobs[name] + [f"hydra.run.dir={root / name / 'run'}"], cwd=root / name).finish()

    with ThreadPoolExecutor(max_workers=2) as pool:
        return root, dict(pool.map(one, jobs))


@pytest.mark.slow
def test_inconsistent_batch_is_one_line_before_any_worker(example_runs):
    root, results = example_runs
    result = results["inconsistent"]
    assert result.returncode == 1, result.describe()
    assert result.stderr.strip().splitlines() == [
        "error: deepspeed_config: train_batch_size=30 != train_micro_batch_size_per_gpu=4 x gradient_accumulation_steps=4 "
        "x world size 2 (trainer.devices x trainer.num_nodes = 2 x 1); 30 is not a multiple of micro x accumulation = 16, "
        "so no world size fits"], result.describe()
    assert "[rank" not in result.output and not (root / "inconsistent" / "run" / "metrics.jsonl").exists()


def test_every_example_config_is_run_here():
    assert sorted(p.name for p in EXAMPLES.glob("*.json")) == [
        "zero1_adamw_cosine.json", "zero2_fp16_adamw.json", "zero3_bf16_monitors.json"]


@pytest.mark.slow
def test_zero1_adamw_cosine_trains_on_two_ranks(example_runs):
    root, results = example_runs
    result = results["zero1"]
    assert result.returncode == 0, result.describe()
    assert "strategy ddp, world size 2, global batch 64 (batch 16 x accumulate 2 x 2 ranks)" in result.output
    assert "not used here: zero_optimization.reduce_bucket_size" in result.output
    rows = [r for r in read_metrics(str(root / "zero1" / "run")) if "train/loss" in r]
    assert [r["step"] for r in rows] == [5, 10]  # steps_per_print: 5
    # WarmupCosineLR, linear warm-up over 20 steps from 0; the logged lr is the one for the next step.
    assert [r["train/lr"] for r in rows] == pytest.approx([3e-3 * (s - 1) / 20 for s in (5, 10)], rel=1e-6)
    assert rows[-1]["train/loss"] < rows[0]["train/loss"]


@pytest.mark.slow
def test_zero3_bf16_monitors_trains_on_two_ranks(example_runs):
    root, results = example_runs
    result = results["zero3"]
    assert result.returncode == 0, result.describe()
    assert "strategy fsdp, world size 2, global batch 8 (batch 2 x accumulate 2 x 2 ranks)" in result.output
    rows = [r for r in read_metrics(str(root / "zero3" / "run")) if "train/loss" in r]
    assert [r["step"] for r in rows] == [2, 4]  # steps_per_print: 2
    assert all("time/forward_ms" in r and r["train/lr"] == 0.001 for r in rows)  # wall_clock_breakdown; Adam lr
    logs = root / "zero3" / "output" / "ds_logs" / "train_bert"  # output_path/job_name, relative to the start dir
    assert (logs / "metrics.csv").is_file() and list(logs.glob("events.out.tfevents.*"))


@pytest.mark.slow
def test_zero2_fp16_adamw_trains_on_two_ranks(example_runs):
    root, results = example_runs
    result = results["zero2"]
    assert result.returncode == 0, result.describe()
    assert "strategy fsdp, world size 2, global batch 32 (batch 8 x accumulate 2 x 2 ranks)" in result.output
    assert "zero_optimization.contiguous_gradients, zero_optimization.reduce_scatter" in result.output
    rows = [r for r in read_metrics(str(root / "zero2" / "run")) if "train/loss" in r]
    assert [r["step"] for r in rows] == [2, 4] and all(r["train/loss_scale"] == 2.0**16 for r in rows)
    # WarmupLR, log warm-up over 100 steps from 0 to 1e-3; the logged lr is the one for the next step.
    assert [r["train/lr"] for r in rows] == pytest.approx([1e-3 * math.log(s) / math.log(100) for s in (2, 4)], rel=1e-6)
