"""What a finished call hands back to the Trainer: progress, metrics, the resolved settings and what
the entry point returns. The loop never writes the Trainer; the facade stores a ``RunResult`` on it
once the call is over (``Trainer._store_result``).

In-process runs (one process, or a rank under torchrun) return it directly. Spawned workers train
copies: at the end rank 0 writes it to a file in the run directory (never a pipe: the weights may be
large), with the full weights of a fit gathered by the strategy's ``full_state_dict`` (a collective,
once per call, not per step); the launcher reads it (``read_result_file``) and deletes the file.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from trainer.api.batch_settings import BatchSettings

if TYPE_CHECKING:
    from trainer.loop.rank_run import RankRun

RESULT_FILE = ".fit_result.pt"


@dataclass
class RunResult:
    """One call's outcome on one rank (what rank 0 hands back is the caller's)."""

    returned: Any  # what fit / validate / test / predict return (rank 0; None on the other ranks)
    global_step: int  # optimizer steps
    batches: int  # global batches trained (the logged step axis; differs from global_step under manual optimization)
    current_epoch: int
    metrics: dict[str, float]  # the last logged value of each metric
    shown: dict[str, float]  # callback_metrics: what callbacks saw last
    hidden: list[str]  # self.log(..., logger=False) names: kept out of logged_metrics
    batch: BatchSettings | None  # the run's resolved batch settings
    run_dir: str
    model: Any = None  # the wrapped module (in-process calls only: a spawned one's stays in its worker)
    state_dict: dict[str, torch.Tensor] | None = field(default=None, repr=False)  # spawned fit: the full weights
    #: spawned: {index among trainer.callbacks: results} of the callbacks that keep results for the caller
    callback_results: dict[int, Any] = field(default_factory=dict, repr=False)
    #: with several evaluation loaders: metric name -> the loader whose batches alone logged it
    loader_of: dict[str, int] = field(default_factory=dict)
    #: the names of ``shown`` that ``self.log(..., prog_bar=True)`` gave (Lightning's progress_bar_metrics)
    prog_bar: list[str] = field(default_factory=list)
    #: the last evaluation batch rows' values (``self.log(..., on_step=True)`` in validation / test)
    eval_step_values: dict[str, float] = field(default_factory=dict)

    @property
    def logged_metrics(self) -> dict[str, float]:
        """The metrics the loggers got (without the hidden ones)."""
        return {k: v for k, v in self.metrics.items() if k not in self.hidden}


def collect_result(run: RankRun, mode: str, returned: Any) -> RunResult:
    """On every rank after a clean call: its result; under spawned workers rank 0 also writes it, with the
    full weights after a fit (a collective on every rank), for the caller (``read_result_file``)."""
    # What callbacks saw last (the latest step values too, as Lightning's callback_metrics), as numbers.
    shown = {k: float(v) if isinstance(v, torch.Tensor) else v for k, v in run.view.callback_metrics.items()}
    result = RunResult(returned=returned if run.rank == 0 else None, global_step=run.global_step, batches=run.step,
                       current_epoch=run.epoch, metrics={**run.eval_step_values, **run.last_metrics}, shown=shown,
                       hidden=sorted(run.module_logs.hidden), prog_bar=sorted(run.module_logs.prog_bar_names()),
                       eval_step_values=dict(run.eval_step_values),
                       batch=run.batch, run_dir=run.run_dir, model=run.wrapped, loader_of=dict(run.module_logs.loader_of),
                       callback_results={index: callback.results() for index, callback in enumerate(run.trainer.callbacks)
                                         if callable(getattr(callback, "results", None))})
    if run.env.launcher != "spawned":
        return result
    weights = run.strategy.full_state_dict(run.module) if mode == "fit" and run.trainer.return_weights else None
    if run.rank == 0:
        path = os.path.join(run.run_dir, RESULT_FILE)
        record = {f.name: getattr(result, f.name) for f in dataclasses.fields(result) if f.name != "model"}
        record.update(state_dict=weights, batch=dataclasses.asdict(run.batch) if run.batch is not None else None)
        torch.save(record, path + ".tmp")  # plain types and tensors: read back with weights_only=True
        os.replace(path + ".tmp", path)
    return result


def read_result_file(run_dir: str) -> RunResult:
    """In the launcher after spawned workers finished: rank 0's result, its file deleted."""
    path = os.path.join(run_dir, RESULT_FILE)
    if not os.path.isfile(path):
        raise RuntimeError(f"the workers finished but left no result in {path}")
    try:
        record = torch.load(path, map_location="cpu", weights_only=True)
    finally:
        os.remove(path)
    batch = record.pop("batch")
    return RunResult(**record, batch=BatchSettings(**batch) if batch is not None else None)


def print_metrics_table(results: Any, mode: str, verbose: bool) -> None:
    """``verbose=True`` (Lightning's default): print ``validate`` / ``test``'s metrics as a table where
    they are returned (rank 0 / the caller of spawned workers)."""
    if verbose and results:
        width = max(len(name) for name in results)
        rule = "-" * (width + 18)
        lines = [rule, f"{mode + ' metric':<{width}}  value", rule]
        lines += [f"{name:<{width}}  {value:.6g}" if isinstance(value, float) else f"{name:<{width}}  {value}"
                  for name, value in sorted(results.items())]
        print("\n".join(lines + [rule]))
