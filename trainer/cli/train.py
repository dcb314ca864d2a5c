"""The train job of the ``trainer`` command: ``train.py``'s Hydra app, reading the built-in configs
from the installed package (``builtin_config_dir``) instead of the checkout's ``conf/``.

The module is named ``train`` on purpose: Hydra names the job after the file that holds the task, so
the run directory's log is ``train.log`` as under ``python train.py``.
"""

from __future__ import annotations

import sys

import hydra

from trainer.cli.hydra_app import main, run_job
from trainer.runtime.config_dir import builtin_config_dir


@hydra.main(config_path=str(builtin_config_dir()), config_name="config", version_base="1.3")
def hydra_task(cfg):
    return run_job(cfg)


def train(argv: list[str], prog: str = "trainer") -> None:
    """Run the job with ``argv`` as train.py's arguments (overrides, ``-m``, ``--config-dir``, ...);
    under torchrun / srun every rank calls this, as every rank runs ``train.py``."""
    sys.argv = [prog, *argv]
    main(hydra_task)
