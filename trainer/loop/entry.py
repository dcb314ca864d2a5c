"""The facade's one call into the loop: run ``fit`` / ``validate`` / ``test`` / ``predict`` on this
rank, with the rank's logging set up, the Trainer read-only while the run is live, and the run torn
down however it ends. Returns the call's ``RunResult``; the facade stores it on the Trainer."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from trainer.checkpoint import CheckpointError
from trainer.loop.evaluation import run_evaluation
from trainer.loop.fit_build import build_fit
from trainer.loop.rank_run import RankRun
from trainer.loop.run_build import build_run
from trainer.loop.run_result import RunResult, collect_result
from trainer.runtime.launch import ClusterEnvironment
from trainer.runtime.rank_logging import configure_rank_logging
from trainer.runtime.torch_flags import torch_flags

if TYPE_CHECKING:
    from trainer.api.module import TrainModule
    from trainer.trainer import Trainer

log = logging.getLogger(__name__)


def run_on_rank(trainer: Trainer, module: TrainModule, mode: str, env: ClusterEnvironment) -> RunResult:
    """Run ``mode`` on this rank: build the run, fit or evaluate, hand back the result."""
    # Hydra's process has root handlers (console + train.log); workers we spawned or torchrun
    # ranks that did not run Hydra get their own stderr handler.
    own_log_handler = not logging.getLogger().handlers
    configure_rank_logging(env.rank, own_handler=own_log_handler)
    run = RankRun(trainer, module, env, own_log_handler)
    clean = False
    with live(trainer, run):
        try:
            with torch_flags(trainer.deterministic, trainer.benchmark, trainer.detect_anomaly):  # on every rank
                build_run(run)
                if mode == "fit":
                    build_fit(run)
                    returned = run.fit()
                else:
                    returned = run_evaluation(run, mode)  # validate / test / predict
            result = collect_result(run, mode, returned)  # the weights for the caller of a spawned fit
            run.hooks.call("teardown", trainer.stage)  # datamodule, callbacks, module
            clean = True
        except BaseException as error:
            _report(run, env, error)
            raise
        finally:
            run.teardown(clean)
    return result


@contextmanager
def live(trainer: Trainer, run: RankRun) -> Iterator[None]:
    """While the run is live: the Trainer's run properties read it (``trainer._run_view``), and the
    Trainer refuses writes (it holds configuration: trainer/api/trainer_resolved.py)."""
    object.__setattr__(trainer, "_run_view", run.view)
    object.__setattr__(trainer, "_live", True)
    try:
        yield
    finally:
        object.__setattr__(trainer, "_live", False)
        object.__setattr__(trainer, "_run_view", None)
        # what the last call counted stays readable after it, as in Lightning (trainer/api/run_state.py)
        object.__setattr__(trainer, "_last_batch_counts", (run.view.num_training_batches, run.view.num_val_batches))
        validates = "data" in run.__dict__ and run.view.has_validation
        object.__setattr__(trainer, "_last_loaders", (run.view.returned_loaders, run.view.num_eval_batches, validates))
        object.__setattr__(trainer, "_stopped", run.view.stop_requested)  # trainer.should_stop after the call
        if run.__dict__.get("lr_scheduling") is not None:  # a fit's optimizers stay readable until the next fit's
            object.__setattr__(trainer, "_last_optimization", (run.view.optimizers, run.view.lr_scheduler_configs))


def _report(run: RankRun, env: ClusterEnvironment, error: BaseException) -> None:
    """The on_exception hooks, then the failure in this rank's log (once per job when spawned)."""
    hooks = run.__dict__.get("hooks")  # (none yet if the build failed before the dispatcher)
    if hooks is not None and isinstance(error, (Exception, KeyboardInterrupt)):
        try:
            hooks.call("on_exception", error)
        except Exception:  # the run's own error is the one to report
            log.exception("rank %d: an on_exception hook failed", env.rank)
    if isinstance(error, CheckpointError):  # it names the file; a traceback would say nothing more
        log.error("rank %d failed: %s", env.rank, error)
    elif isinstance(error, KeyboardInterrupt):  # the user's stop, not a failure: no traceback
        log.warning("rank %d interrupted (KeyboardInterrupt): the run was shut down", env.rank)
    elif env.launcher != "spawned":  # spawned: the launcher shows the first failure once (launch.spawn)
        log.exception("rank %d failed", env.rank)
