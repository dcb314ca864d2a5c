"""The submitit launchers' settings (``hydra.launcher.*``) checked against each job's trainer settings
before any job is submitted: a setting that cannot work ends the command with one line naming the key
(`SettingError`), instead of jobs that wait in a queue and then fail, or hang waiting for ranks that never come.

A job runs its ranks one of two ways: one task whose trainer spawns ``trainer.devices`` ranks
(``tasks_per_node=1``, one node), or one task per rank (``tasks_per_node=trainer.devices`` on each of
``nodes=trainer.num_nodes`` nodes), where the trainer reads its rank from submitit's / SLURM's variables.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from trainer.cli.errors import SettingError


def _known_keys(kind: str) -> list[str]:
    from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf, SlurmQueueConf

    schema = LocalQueueConf if kind == "local" else SlurmQueueConf
    return [field.name for field in dataclasses.fields(schema)]


def check_launcher_keys(kind: str, params: dict) -> None:
    """Every key is one of the submitit launcher's settings."""
    known = _known_keys(kind)
    extra = [key for key in params if key not in known]
    if extra:
        raise SettingError(f"hydra.launcher.{extra[0]} is not a setting of hydra/launcher=submitit_{kind}; "
                           f"its settings are {', '.join(k for k in known if not k.startswith('_'))}")


def _count(key: str, value: Any, least: int, unit: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise SettingError(f"hydra.launcher.{key}={value!r} must be an integer of {least} or more{unit}")
    return value


def check_settings(kind: str, params: dict, devices: Any, num_nodes: Any, save_on_signal: Any = True) -> None:
    """One job's launcher settings with its ``trainer.devices``, ``trainer.num_nodes`` and
    ``checkpoint.save_on_signal``."""
    timeout_min = _count("timeout_min", params.get("timeout_min"), 1, " (minutes)")
    tasks = _count("tasks_per_node", params.get("tasks_per_node"), 1)
    nodes = _count("nodes", params.get("nodes"), 1)
    gpus = params.get("gpus_per_node")
    if gpus is not None:
        _count("gpus_per_node", gpus, 0)
    if kind == "slurm":
        delay = _count("signal_delay_s", params.get("signal_delay_s"), 0, " (seconds)")
        if delay >= 60 * timeout_min:
            raise SettingError(f"hydra.launcher.signal_delay_s={delay}: the signal to save comes this long before the "
                               f"time limit, which is hydra.launcher.timeout_min={timeout_min} minutes; make it shorter")
        requeues = _count("max_num_timeout", params.get("max_num_timeout"), 0)
        if requeues and save_on_signal:
            # The ranks' own handler answers the signal (save, then end the job): submitit's, which requeues, never runs.
            raise SettingError(f"hydra.launcher.max_num_timeout={requeues}: with checkpoint.save_on_signal=true the "
                               f"ranks answer the time-limit signal by saving and ending the job, so submitit never "
                               f"requeues it; submit the same command again with trainer.resume=auto (and a fixed "
                               f"hydra.sweep.dir), or set checkpoint.save_on_signal=false with checkpoint.every_n_steps "
                               f"and trainer.resume=auto to let submitit requeue")
    if not isinstance(devices, int) or not isinstance(num_nodes, int):
        return  # trainer.devices=auto: the trainer checks the processes it finds
    if tasks not in (1, devices):
        raise SettingError(f"hydra.launcher.tasks_per_node={tasks}: each task of a job is a rank, so it is 1 (the "
                           f"trainer starts trainer.devices={devices} ranks itself) or trainer.devices={devices}")
    if nodes > 1 and (tasks != devices or num_nodes != nodes):
        raise SettingError(f"hydra.launcher.nodes={nodes}: a job on several nodes starts every rank as a task: "
                           f"hydra.launcher.tasks_per_node=trainer.devices ({devices}) and trainer.num_nodes={nodes}")
    if nodes == 1 and num_nodes != 1:
        raise SettingError(f"trainer.num_nodes={num_nodes} but hydra.launcher.nodes=1: give the job "
                           f"hydra.launcher.nodes={num_nodes} and hydra.launcher.tasks_per_node={devices}")
    if gpus and gpus < devices:
        raise SettingError(f"hydra.launcher.gpus_per_node={gpus} is fewer than the job's trainer.devices={devices} "
                           f"ranks per node (one GPU each); give gpus_per_node={devices}, or null on a CPU partition")


def check_jobs(kind: str, launcher: Any, job_overrides: Sequence[Sequence[str]]) -> None:
    """Every job of the batch (its own trainer settings, e.g. a sweep over trainer.devices), before any starts."""
    loader = launcher.hydra_context.config_loader
    for overrides in job_overrides:
        config = loader.load_sweep_config(launcher.config, list(overrides))
        save_on_signal = (config.get("checkpoint") or {}).get("save_on_signal", False)
        check_settings(kind, launcher.params, config.trainer.get("devices"), config.trainer.get("num_nodes"),
                       save_on_signal)
