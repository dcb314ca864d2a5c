"""torchrun elastic restarts (``--max-restarts``): a restarted attempt continues the same run.

A restart re-runs ``train.py`` on every rank. Two things make it a continuation: the run
directory of the first attempt is reused (rank 0 records it under ``outputs/.elastic/``, keyed by
torchrun's run id and its agent's pid, both stable across restarts), and ``trainer.resume``
defaults to ``auto`` on a restarted attempt, so training goes on from the latest complete checkpoint.
"""

from __future__ import annotations

import os
from typing import Mapping

RECORDS = os.path.join("outputs", ".elastic")


def restart_count(environ: Mapping[str, str] = os.environ) -> int:
    """How many times torchrun restarted the workers (0: first attempt or no torchrun)."""
    return int(environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def _record_path(environ: Mapping[str, str]) -> str | None:
    run_id = environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None:
        return None
    # The agent (our parent) lives across restarts; with static rendezvous the run id is "none".
    return os.path.join(RECORDS, f"{run_id}-{os.getppid()}")


def record_run_dir(run_dir: str, environ: Mapping[str, str] = os.environ) -> None:
    """First attempt, rank 0: remember the run directory for restarts."""
    path = _record_path(environ)
    if path is None or restart_count(environ) > 0:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(os.path.abspath(run_dir))


def pin_run_dir(argv: list[str], environ: Mapping[str, str] = os.environ) -> list[str]:
    """Restarted attempt, rank 0: ``argv`` plus ``hydra.run.dir=<first attempt's>`` (unless the
    user fixed the run dir, or runs a multirun)."""
    path = _record_path(environ)
    if path is None or restart_count(environ) == 0 or not os.path.isfile(path):
        return argv
    if any(a.startswith(("hydra.run.dir=", "-m", "--multirun")) for a in argv[1:]):
        return argv
    with open(path, encoding="utf-8") as handle:
        return [*argv, f"hydra.run.dir={handle.read().strip()}"]
