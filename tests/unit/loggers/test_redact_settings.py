"""A value the config keeps under a secret-named key is redacted wherever it is repeated (the
config itself, W&B's run settings), and the settings passed to ``wandb.init`` (notes, name, tags,
group) go through the same rule as the config."""

from __future__ import annotations

import os
import time

import pytest

from tests.unit.loggers.test_loggers import (
    CONFIG_SECRET,
    CONFIG_WITH_SECRETS,
    ENV_SECRET,
    files_containing,
    no_network_wandb,
    offline_runs,
    wandb_records,
)
from trainer.loggers import WandbLogger
from trainer.runtime.redact import redact_argv, redact_secrets

# W&B offline, its files under tmp_path, no network (the fixture of test_loggers.py).
pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures(no_network_wandb.__name__)]


def test_a_secret_repeated_under_a_plain_key_is_redacted():
    from trainer.runtime.redact import secret_values

    config = {"hub": {"hf_token": "tok-abcdef", "pin": {"key": "123"}}, "notes": "run for tok-abcdef",
              "tags": ["x-tok-abcdef", "123"], "count": 123}
    assert secret_values(config) == ["tok-abcdef"]  # "123": too short to look for elsewhere
    assert redact_secrets(config, {}) == {"hub": {"hf_token": "***", "pin": {"key": "***"}}, "notes": "run for ***",
                                          "tags": ["x-***", "123"], "count": 123}
    # A writer that writes settings apart from the config passes the config's secret values.
    assert redact_secrets({"notes": "n tok-abcdef"}, {}, secrets=secret_values(config)) == {"notes": "n ***"}
    assert redact_argv(["a=${hub.hf_token}", "b=tok-abcdef"], {}, secrets=["tok-abcdef"]) == ["a=${hub.hf_token}", "b=***"]


def run_records(run_file) -> list:
    """The run records of a ``.wandb`` file, read again for up to 15 s while W&B's service process
    may still be flushing it after ``finish()``."""
    deadline = time.time() + 15
    while True:
        runs = [record.run for record in wandb_records(run_file) if record.WhichOneof("record_type") == "run"]
        if runs or time.time() > deadline:
            return runs
        time.sleep(0.2)


def test_wandb_run_settings_are_redacted(tmp_path):
    logger = WandbLogger.in_run_dir(str(tmp_path), project="proj", name=f"n-{ENV_SECRET}", notes=f"run for {ENV_SECRET}",
                                    tags=[f"t-{CONFIG_SECRET}", "plain"], group=f"g-{CONFIG_SECRET}")
    logger.log_hyperparams(CONFIG_WITH_SECRETS)  # holds CONFIG_SECRET under wandb.api_key
    logger.log_metrics({"train/loss": 1.0}, 1)
    logger.finalize()

    (run_dir,) = offline_runs(tmp_path)
    (run_file,) = [os.path.join(run_dir, name) for name in os.listdir(run_dir) if name.endswith(".wandb")]
    (run,) = run_records(run_file)
    assert (run.display_name, run.notes, list(run.tags), run.run_group) == ("n-***", "run for ***", ["t-***", "plain"],
                                                                            "g-***")
    assert files_containing(tmp_path, [CONFIG_SECRET, ENV_SECRET]) == []


def test_log_lines_are_redacted(tmp_path, capsys):
    import logging

    from trainer.runtime.rank_logging import configure_rank_logging, log_to_file

    logger = logging.getLogger("trainer")
    before = (list(logger.handlers), logger.propagate, logger.level)
    try:
        configure_rank_logging(0, own_handler=True)
        log_to_file(str(tmp_path / "train.log"))
        logging.getLogger("trainer.some.module").warning("bad value %r; url %s", ENV_SECRET, "https://u:pw12@host/x")
    finally:
        for handler in logger.handlers:
            if handler not in before[0]:
                handler.close()
        logger.handlers[:], logger.propagate = before[0], before[1]
        logger.setLevel(before[2])
    for text in (capsys.readouterr().err, (tmp_path / "train.log").read_text()):
        assert "bad value '***'; url https://***@host/x" in text and ENV_SECRET not in text, text


def test_a_checkpoint_record_redacts_a_secret_repeated_under_another_hyperparameter():
    from trainer.api.hparams_display import checkpoint_record

    record = checkpoint_record({"hf_token": "tok-abcdef", "note": "for tok-abcdef", "lr": 0.1})
    assert record["values"] == {"hf_token": "***", "note": "for ***", "lr": 0.1}
    assert record["redacted"] == ["hf_token", "note"]  # never stored: load_from_checkpoint asks for both
