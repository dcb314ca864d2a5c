"""A Hydra sweeper that searches with Optuna: ``trainer -m hydra/sweeper=optuna 'optimizer.lr=interval(1e-4,1e-1)'``.

Hydra finds it as ``hydra_plugins.meshtrainer_sweeper.OptunaSweeper`` (the plugin package this distribution
ships); conf/hydra/sweeper/optuna.yaml selects it and documents its settings. Each trial is one Hydra job
(a complete run directory under the sweep directory, launched by whichever launcher is configured); the job
returns the run's ``objective.metric`` and the sweeper tells Optuna. A trial whose job fails (a bad value,
an error while training) or returns a value that is not a finite number (a diverged run) is told to Optuna
as failed, and the sweep goes on with the next trial. At the end the sweep directory holds
``optimization_results.yaml``: the best trial's number, parameters, value and run directory. Trial N runs
as job N (``<sweep dir>/N``), and its run directory is kept with it in Optuna's storage (``run_dir``).

Every setting is checked when the sweeper is set up, before any trial starts: a bad one ends the
command with one line naming the key (`SettingError`).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from hydra.plugins.sweeper import Sweeper

from trainer.cli.errors import SettingError
from trainer.cli.search_space import as_override, split_overrides

log = logging.getLogger(__name__)

_DIRECTIONS = ("minimize", "maximize")
_WHERE = "hydra.sweeper.params"


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SettingError(f"hydra.sweeper.{key}={value!r} must be an integer of 1 or more")
    return value


def _run_dir(job: Any) -> str | None:
    """The trial's run directory (Hydra's output directory of its job)."""
    try:
        return str(job.hydra_cfg.hydra.runtime.output_dir)
    except Exception:  # a launcher that returns no Hydra config with the job
        return None


class OptunaTrialSweeper(Sweeper):
    """Asks Optuna for ``n_trials`` trials, ``n_jobs`` at a time, and launches each as a Hydra job.

    Arguments (``hydra.sweeper.*``): ``n_trials`` (trials this command runs), ``n_jobs`` (trials launched
    together: the launcher may run them side by side), ``direction`` (minimize | maximize the objective),
    ``study_name`` and ``storage`` (an Optuna storage URL such as ``sqlite:///sweep.db``: the study is kept
    there and a later command with the same name continues it; null: in memory), ``sampler`` (a node with
    ``_target_``, e.g. ``optuna.samplers.TPESampler`` and its ``seed``), ``params`` (key: search space,
    as on the command line).
    """

    def __init__(self, n_trials: Any = 20, n_jobs: Any = 1, direction: Any = "minimize", study_name: Any = None,
                 storage: Any = None, sampler: Any = None, params: Any = None, **unknown: Any) -> None:
        if unknown:
            raise SettingError(f"hydra.sweeper.{next(iter(unknown))} is not a setting of the optuna sweeper; "
                               f"its settings are n_trials, n_jobs, direction, study_name, storage, sampler, params")
        self.n_trials = _positive_int("n_trials", n_trials)
        self.n_jobs = _positive_int("n_jobs", n_jobs)
        if direction not in _DIRECTIONS:
            raise SettingError(f"hydra.sweeper.direction={direction!r}: the direction is one of "
                               f"{', '.join(_DIRECTIONS)} (one objective: objective.metric)")
        self.direction = direction
        for key, value in (("study_name", study_name), ("storage", storage)):
            if value is not None and not isinstance(value, str):
                raise SettingError(f"hydra.sweeper.{key}={value!r} must be a string or null")
        self.study_name, self.storage = study_name, storage
        self.sampler_config = sampler
        if params is not None and not hasattr(params, "items"):
            raise SettingError(f"hydra.sweeper.params must map keys to search spaces, e.g. "
                               f"optimizer.lr: interval(0.0001,0.1); got {params!r}")
        self.params = {str(k): str(v) for k, v in (params or {}).items()}
        self.hydra_context: Any = None
        self.config: Any = None
        self.launcher: Any = None

    def setup(self, *, hydra_context: Any, task_function: Any, config: Any) -> None:
        from hydra.core.plugins import Plugins

        metric = config.get("objective", {}).get("metric") if "objective" in config else None
        if not isinstance(metric, str) or not metric:
            raise SettingError(f"objective.metric={metric!r}: the optuna sweeper optimises one logged metric that "
                               f"each trial returns; set it, e.g. objective.metric=val/loss")
        self.metric = metric
        self.hydra_context, self.config = hydra_context, config
        self.sampler = self._sampler()
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    def _sampler(self) -> Any:
        if self.sampler_config is None or not hasattr(self.sampler_config, "keys"):
            return self.sampler_config  # none (Optuna's default), or a sampler built by the caller
        from hydra.utils import instantiate

        if "_target_" not in self.sampler_config:
            raise SettingError("hydra.sweeper.sampler needs a _target_, e.g. optuna.samplers.TPESampler")
        try:
            return instantiate(self.sampler_config)
        except Exception as error:  # a mistyped class or argument: its own words, on one line
            cause = error.__cause__ or error
            raise SettingError(f"hydra.sweeper.sampler ({self.sampler_config._target_}): {cause}") from None

    def sweep(self, arguments: list[str]) -> Any:
        import optuna
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from omegaconf import OmegaConf

        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        fixed, space = split_overrides(parser.parse_overrides([f"{k}={v}" for k, v in self.params.items()]), _WHERE)
        fixed_args, space_args = split_overrides(parser.parse_overrides(arguments), "the command line's")
        fixed = [f for f in fixed if f.split("=", 1)[0] not in space_args] + fixed_args  # the command line wins
        space = {**{k: v for k, v in space.items() if not any(f.startswith(k + "=") for f in fixed_args)},
                 **space_args}
        if not space:
            raise SettingError("hydra.sweeper.params: nothing to search; give a search space, e.g. "
                               "hydra.sweeper.params.optimizer.lr='interval(0.0001,0.1)' or on the command line")
        try:
            study = optuna.create_study(study_name=self.study_name, storage=self.storage, sampler=self.sampler,
                                        direction=self.direction, load_if_exists=self.storage is not None)
        except Exception as error:  # an unreachable or malformed storage URL
            raise SettingError(f"hydra.sweeper.storage={self.storage!r}: {' '.join(str(error).split())}") from None
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        log.info("optuna study %s: %d trials, %s %s over %s", study.study_name, self.n_trials, self.direction,
                 self.metric, ", ".join(space))
        launched, going_on = 0, True
        while going_on and launched < self.n_trials:
            trials = [study.ask(space) for _ in range(min(self.n_jobs, self.n_trials - launched))]
            batch = [fixed + [as_override(k, v) for k, v in trial.params.items()] for trial in trials]
            self.validate_batch_is_legal(batch)
            # Job numbers are trial numbers: a stored study continued in the same sweep directory keeps
            # its earlier trials' run directories.
            returns = self.launcher.launch(batch, initial_job_idx=trials[0].number)
            for trial, job in zip(trials, returns):
                if _run_dir(job) is not None:  # kept with the trial in Optuna's storage
                    trial.set_user_attr("run_dir", _run_dir(job))
                going_on = self._tell(study, trial, job) and going_on
            launched += len(trials)
        return self._results(study, sweep_dir)

    def _tell(self, study: Any, trial: Any, job: Any) -> bool:
        """Tell Optuna the trial's outcome; False when the sampler asks to stop (a grid or brute-force
        sampler that tried every point: it calls ``study.stop()``, which outside ``optimize`` raises once the
        trial is stored)."""
        import optuna
        from hydra.core.utils import JobStatus

        value, why = None, None
        if job.status != JobStatus.COMPLETED:
            why = f"{type(job._return_value).__name__}: {job._return_value}"
        elif job.return_value is None:
            why = "the job could not start (its error is printed above)"
        elif isinstance(job.return_value, bool) or not isinstance(job.return_value, (int, float)):
            why = f"it returned {job.return_value!r}, not the number objective.metric={self.metric} names"
        elif not math.isfinite(job.return_value):
            why = f"{self.metric} is {job.return_value} (diverged)"
        else:
            value = float(job.return_value)
        if value is None:
            log.warning("trial %d failed: %s", trial.number, " ".join(str(why).split()))
        else:
            log.info("trial %d: %s=%s", trial.number, self.metric, value)
        try:
            if value is None:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                study.tell(trial, value)
        except RuntimeError as error:
            if "Study.stop" not in str(error):
                raise
            log.info("the sampler has tried its whole search space: the sweep ends after trial %d", trial.number)
            return False
        return True

    def _results(self, study: Any, sweep_dir: Path) -> dict[str, Any]:
        from omegaconf import OmegaConf

        import optuna

        completed = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
        if not completed:
            raise SettingError(f"the optuna sweep ended without a completed trial ({len(study.trials)} failed: "
                               f"see each trial's error above)")
        best = study.best_trial
        results = {"name": "optuna", "study_name": study.study_name, "metric": self.metric,
                   "direction": self.direction, "best_trial": best.number, "best_params": dict(best.params),
                   "best_value": best.value, "best_run_dir": best.user_attrs.get("run_dir"),
                   "trials": len(study.trials), "failed": sum(t.state == optuna.trial.TrialState.FAIL
                                                               for t in study.trials)}
        (sweep_dir / "optimization_results.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(results)))
        log.info("best trial %d: %s=%s with %s", best.number, self.metric, best.value, best.params)
        return results
