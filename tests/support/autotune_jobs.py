"""The autotuner's job for a command line, as `trainer autotune` builds it (for the autotune tests)."""

from __future__ import annotations

from pathlib import Path

from trainer.autotune.settings import Job, check_settings, compose, split_overrides


def job_for(argv: list[str], tmp_path: Path) -> Job:
    """The job of ``trainer autotune <argv>``, writing its trials under ``tmp_path``."""
    from omegaconf import OmegaConf

    run, tune = split_overrides(argv)
    config = compose(run + tune)
    block = OmegaConf.to_container(config.autotune)
    block["out_dir"] = str(tmp_path)
    return Job(run, config, check_settings(block))
