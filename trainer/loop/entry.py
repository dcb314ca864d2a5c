"""The facade's one call into the loop: run ``fit`` / ``validate`` / ``test`` / ``predict`` on this
rank, with the rank's logging set up and the run torn down however it ends."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from trainer.checkpoint import CheckpointError
from trainer.loop.evaluation import run_evaluation
from trainer.loop.rank_run import _Run
from trainer.loop.weights_return import record_result
from trainer.runtime.launch import ClusterEnvironment
from trainer.runtime.rank_logging import configure_rank_logging
from trainer.runtime.torch_flags import torch_flags

if TYPE_CHECKING:
    from trainer.api.module import TrainModule
    from trainer.trainer import Trainer

log = logging.getLogger("trainer.loop.rank_run")


def run_on_rank(trainer: Trainer, module: TrainModule, mode: str, env: ClusterEnvironment) -> dict[str, float] | None:
    """Fit or validate on this rank; rank 0 returns the last logged metrics."""
    # Hydra's process has root handlers (console + train.log); workers we spawned or torchrun
    # ranks that did not run Hydra get their own stderr handler.
    own_log_handler = not logging.getLogger().handlers
    configure_rank_logging(env.rank, own_handler=own_log_handler)
    run = _Run(trainer, module, env, own_log_handler)
    trainer._run_view = run.view  # for callbacks: trainer.callbacks.run_of(trainer)
    clean = False
    try:
        with torch_flags(trainer.deterministic, trainer.benchmark):  # deterministic= / benchmark=, on every rank
            run.setup()
            results = run.fit() if mode == "fit" else run_evaluation(run, mode)  # validate / test / predict
        record_result(run, mode)  # trainer.global_step ...; the weights for the caller of a spawned fit
        run.hooks.call("teardown", trainer.stage)  # datamodule, callbacks, module
        clean = True
    except BaseException as error:
        hooks = getattr(run, "hooks", None)  # (none yet if the set-up failed before building them)
        if hooks is not None and isinstance(error, (Exception, KeyboardInterrupt)):
            try:
                hooks.call("on_exception", error)
            except Exception:  # the run's own error is the one to report
                log.exception("rank %d: an on_exception hook failed", env.rank)
        if isinstance(error, CheckpointError):  # it names the file; a traceback would say nothing more
            log.error("rank %d failed: %s", env.rank, error)
        elif env.launcher != "spawned":  # spawned: the launcher shows the first failure once (launch.spawn)
            log.exception("rank %d failed", env.rank)
        raise
    finally:
        trainer._run_view = None
        run.teardown(clean)
    return results if run.rank == 0 else None
