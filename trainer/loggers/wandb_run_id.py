"""Which W&B (and MLflow) run a run directory continues: the id stored in ``<run_dir>/wandb_run_id``
(``mlflow_run_id``), and a resume into a new run directory adopting the ids of the checkpoint's run
(so the W&B and MLflow runs go on)."""

from __future__ import annotations

import os

RUN_ID_FILE = "wandb_run_id"
MLFLOW_RUN_ID_FILE = "mlflow_run_id"
#: The run ids a resume into a new run directory carries over.
ADOPTED_FILES = (RUN_ID_FILE, MLFLOW_RUN_ID_FILE)


def stored_run_id(run_dir: str, filename: str = RUN_ID_FILE) -> str | None:
    """The run id saved in ``<run_dir>/<filename>`` (W&B's by default) by an earlier start, if any."""
    try:
        with open(os.path.join(run_dir, filename), encoding="utf-8") as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def adopt_run_id(previous_run_dir: str, run_dir: str) -> str | None:
    """For a job resumed into a new run directory from a checkpoint of ``previous_run_dir``: store
    that run's W&B and MLflow ids in ``run_dir`` (each unless ``run_dir`` has one already), so those
    runs go on. Returns the W&B id now stored in ``run_dir``, if any. Call it before the loggers are built."""
    for filename in ADOPTED_FILES:
        previous = stored_run_id(previous_run_dir, filename)
        if stored_run_id(run_dir, filename) is None and previous is not None:
            store_run_id(run_dir, previous, filename)
    return stored_run_id(run_dir)


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


def store_run_id(run_dir: str, run_id: str, filename: str = RUN_ID_FILE) -> None:
    """Keep ``run_id`` in ``<run_dir>/<filename>`` (written atomically)."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, filename)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(run_id + "\n")
    os.replace(path + ".tmp", path)
