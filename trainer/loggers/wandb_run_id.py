"""Which W&B run a run directory continues: the id stored in ``<run_dir>/wandb_run_id``, and a resume
into a new run directory adopting the id of the checkpoint's run (so the W&B run goes on)."""

from __future__ import annotations

import os

RUN_ID_FILE = "wandb_run_id"


def stored_run_id(run_dir: str) -> str | None:
    """The W&B run id saved in ``<run_dir>/wandb_run_id`` by an earlier start, if any."""
    try:
        with open(os.path.join(run_dir, RUN_ID_FILE), encoding="utf-8") as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def adopt_run_id(previous_run_dir: str, run_dir: str) -> str | None:
    """For a job resumed into a new run directory from a checkpoint of ``previous_run_dir``: store
    that run's W&B id in ``run_dir`` (unless ``run_dir`` has one already), so the W&B run goes
    on. Returns the id now stored in ``run_dir``, if any. Call it before the loggers are built."""
    current = stored_run_id(run_dir)
    previous = stored_run_id(previous_run_dir)
    if current is None and previous is not None:
        store_run_id(run_dir, previous)
        return previous
    return current


def adopt_run_of_checkpoint(checkpoint: str, run_dir: str) -> str | None:
    """`adopt_run_id` for a resume from the checkpoint path ``checkpoint`` (a checkpoint, or a
    folder inside a run's ``checkpoints/``): the run it belongs to is the folder above ``checkpoints/``."""
    return adopt_run_id(run_dir_of_checkpoint(checkpoint), run_dir)


def run_dir_of_checkpoint(checkpoint: str) -> str:
    """The run directory a checkpoint path (a checkpoint, or a folder inside a run's ``checkpoints/``)
    belongs to: the folder above ``checkpoints/``."""
    checkpoints = os.path.abspath(checkpoint)
    while os.path.basename(checkpoints) not in ("checkpoints", "") and not os.path.isfile(
        os.path.join(checkpoints, "latest")
    ):
        checkpoints = os.path.dirname(checkpoints)
    return os.path.dirname(checkpoints)


def store_run_id(run_dir: str, run_id: str) -> None:
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, RUN_ID_FILE)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(run_id + "\n")
    os.replace(path + ".tmp", path)
