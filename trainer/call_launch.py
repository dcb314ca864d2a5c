"""A checked call (``trainer/entry_points.py``) run and its result handed back: in this process, or in
workers the trainer spawns; the finished call's ``RunResult`` (``trainer/loop/run_result.py``) is
stored on the Trainer here, once the run is over (the Trainer is read-only while it is live)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer.loggers import settle_versions
from trainer.loop.run_result import RunResult, print_metrics_table, read_result_file
from trainer.loop.weights_return import deliver_weights
from trainer.runtime.launch import ClusterEnvironment, detect_environment, spawn
from trainer.trainer_checks import check_environment

if TYPE_CHECKING:
    from trainer.api.module import TrainModule
    from trainer.trainer import Trainer


def run_call(trainer: Trainer, mode: str, module: TrainModule, verbose: bool = False) -> Any:
    """Run the checked call here or in spawned workers, store its result, return what the entry point
    returns (validate / test: the metrics, printed as a table with ``verbose``)."""
    env = detect_environment()
    check_environment(env, trainer.strategy, trainer.devices, trainer.num_nodes)
    try:
        if env.launcher == "none" and trainer.world_size > 1:
            settle_versions(trainer.logger_specs)  # the caller's logger objects name the folders the workers write
            spawn(_run_spawned, (trainer, module, mode), nprocs=trainer.devices, timeout=trainer.collective_timeout)
            result = read_result_file(trainer.run_dir)
            for index, results in result.callback_results.items():  # e.g. a ModelCheckpoint's best_model_path
                trainer.callbacks[index].adopt_results(results)
            if mode == "fit":
                deliver_weights(module, result.state_dict, trainer.run_dir)
            module._trainer = trainer  # as after an in-process run: module.global_step ... read this trainer
        else:
            result = _run_here(trainer, module, mode, env)
    except BaseException:
        trainer._status = "interrupted"  # trainer.state.status, as Lightning's after a call that raised
        raise
    _store_result(trainer, result, module, mode)
    trainer._status = "finished"
    if mode in ("validate", "test"):
        print_metrics_table(result.returned, mode, verbose)
    return result.returned


def _store_result(trainer: Trainer, result: RunResult, module: TrainModule, mode: str) -> None:
    """What a finished call leaves on the Trainer: progress, metrics, the resolved settings; after a
    ``fit`` its module and datamodule, reused by ``validate()`` / ``test()`` / ``predict()``."""
    trainer.global_step, trainer.current_epoch, trainer._batches = result.global_step, result.current_epoch, result.batches
    trainer.callback_metrics, trainer.logged_metrics = dict(result.shown), result.logged_metrics
    trainer._metric_loaders = result.loader_of  # (the results per loader: trainer/lightning/trainer/trainer.py)
    trainer._prog_bar_names = frozenset(result.prog_bar)
    trainer._eval_step_values = result.eval_step_values  # (Lightning's progress_bar_metrics show them)
    trainer._last_batch, trainer.run_dir, trainer._model = result.batch, result.run_dir, result.model
    if mode == "fit":
        trainer._fitted = (module, trainer.datamodule)


def _run_here(trainer: Trainer, module: TrainModule, mode: str, env: ClusterEnvironment) -> RunResult:
    # Imported when a run starts (not a cycle: the loop never imports this module at run time), so
    # `import trainer` and the launcher's checks do not pay for the loop's imports.
    from trainer.loop.entry import run_on_rank

    return run_on_rank(trainer, module, mode, env)


def _run_spawned(trainer: Trainer, module: TrainModule, mode: str) -> None:
    _run_here(trainer, module, mode, detect_environment())  # rank 0 writes the result file (run_result.py)
