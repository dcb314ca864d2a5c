"""Every config key a user adds is read, refused with an error, or (top level only) warned about
once; warnings that every rank gives alike are logged once, by rank 0.

Most checks build in process with Hydra's compose API (``trainer.cli.hydra_app.build``, nothing trained);
one short two-process run checks the rank-0 warnings end to end.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict

from tests.support.helpers import REPO
from trainer.cli.hydra_app import TOP_LEVEL_KEYS, build

CONF_DIR = os.path.join(REPO, "conf")


def composed(overrides: list[str]) -> dict:
    """The resolved config ``train.py`` would build, with Hydra's record of the overrides set (as
    under ``@hydra.main``) so that ``build`` sees which keys were added with ``+``."""
    with initialize_config_dir(CONF_DIR, version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    with open_dict(cfg.hydra.runtime):  # resolve ${hydra:...} without a run
        cfg.hydra.runtime.output_dir = "unused"
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return OmegaConf.to_container(cfg, resolve=True)


@pytest.fixture(autouse=True)
def _no_hydra_record_left():
    yield
    HydraConfig.instance().cfg = None


def test_unknown_top_level_key_warns_once_naming_it_and_the_known_ones(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trainer"):
        build(composed(["recipe=mlp", "+typo=1"]), str(tmp_path))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "typo" in warnings[0] and all(key in warnings[0] for key in TOP_LEVEL_KEYS)


def test_known_config_builds_without_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="trainer"):
        build(composed(["recipe=gpt", "data.path=null"]), str(tmp_path))  # gpt's own data keys are read
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["+trainer.typo=1"], "trainer.typo is not a trainer setting; the trainer settings are devices"),
        (["+trainer.batch_size=8"], "(data.batch_size is one)"),
        (["+strategy.typo=1"], "strategy.typo: trainer.strategies.single.SingleDeviceStrategy takes no argument"),
        (["strategy=ddp", "+strategy.zero_1=true"], "takes no argument 'zero_1' (did you mean strategy.zero1?); it "
                                                    "takes zero1, accelerator, find_unused_parameters"),
        (["+trainer.max_step=10"], "trainer.max_step is not a trainer setting (did you mean trainer.max_steps?); the "
                                   "trainer settings are max_steps, max_time"),
        (["+module.typo=1"], "module.typo: trainer.recipes.mlp.MLPClassifier takes no argument 'typo'; it takes optimizer"),
        (["+optimizer.typo=1"], "optimizer.typo: torch.optim.SGD takes no argument 'typo'"),
        (["scheduler=warmup_cosine", "+scheduler.typo=1"], "scheduler.typo: trainer.optim.schedules.warmup_cosine"),
        (["callbacks=[timer]", "+callbacks.timer.typo=1"], "callbacks.timer.typo: trainer.callbacks.Timer takes no"),
        (["+callbacks.timer.max_time=10"], "callbacks.timer has no _target_ (keys: max_time); select the callback "
                                           "with callbacks=[timer]"),
        (["+data.typo=1"], "data.typo (+data.typo=...) is read by nothing: the trainer reads data.batch_size"),
        (["recipe=gpt", "+data.typo=1"], "this recipe's module reads data.path, data.tokens, data.source, data.stream, "
                                         "data.tokenizer, data.hf, data.block_size"),
        (["+checkpoint.typo=1"], "unknown checkpoint option(s) ['typo']; known:"),
        (["+precision.typo=1"], "precision.typo applies to precision=fp16-mixed only"),
        (["precision=fp16-mixed", "+precision.typo=1"], "options: initial_scale_power"),
        (["+logger.jsonl.typo=1"], "logger 'jsonl' has no option(s) ['typo']; its options: filename"),
    ],
    ids=lambda value: value if isinstance(value, str) and value.startswith("+") else None,
)
def test_unknown_key_inside_a_node_is_an_error_naming_it(overrides, message, tmp_path):
    with pytest.raises(Exception) as error:
        build(composed(["recipe=mlp"] + overrides), str(tmp_path))
    assert message in str(error.value)


def test_added_data_key_that_another_override_reads_is_accepted(tmp_path):
    trainer, module = build(composed(["recipe=mlp", "+data.width=48", "module.hidden=${data.width}"]), str(tmp_path))
    assert module.net[0].out_features == 48


def test_warnings_every_rank_gives_alike_are_logged_once(tmp_path):
    """Two spawned FSDP ranks: the unknown key, the FSDP single-unit and the EarlyStopping warnings
    appear once each (rank 0), in the console and in train.log."""
    run_dir = tmp_path / "run"
    args = [sys.executable, "train.py", "recipe=mlp", "strategy=fsdp", "trainer.devices=2", "trainer.max_steps=2",
            "trainer.val_every_n_steps=null", "trainer.progress_bar=false", "logger=[jsonl]",
            "callbacks=[early_stopping]", "+typo=1", f"hydra.run.dir={run_dir}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_",
                                                                     "TORCHELASTIC", "SLURM_"))}
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    log_file = (run_dir / "train.log").read_text()
    for text in ("config key(s) typo are read by nothing", "FSDP has a single unit",
                 "EarlyStopping(monitor='val/loss'): none of trainer.val_every_n_steps, val_check_interval, check_val_every_n_epoch is set"):
        assert output.count(text) == 1, (text, output)
        assert log_file.count(text) == 1, (text, log_file)
    assert "[rank 1][WARNING]" not in output
