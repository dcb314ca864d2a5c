"""A logged row and what each logger, ``logged_metrics`` and ``callback_metrics`` get of it.

Every row goes to every logger as ``logger.log_metrics(metrics=..., step=...)`` (Lightning's call);
``self.log(..., logger=False)`` names are kept off the loggers.

Under this trainer's ``Trainer`` the row is written whole at the run's step (global batches trained),
the trainer's own values (``train/loss``, ``perf/...``, ``memory/...``) among the module's.

Under Lightning's ``Trainer`` (``trainer.lightning``: ``Trainer.lightning_rows`` is True) the loggers
and the metrics the Trainer shows hold what the module and callbacks logged, as Lightning's do:

- the trainer's own values are left out; they stay in the trainer's own record (``metrics.jsonl``,
  written whole at the run's step as above, which this trainer's tools read);
- an epoch-level row (training rows, epoch ends, evaluation results) carries ``"epoch"``, the
  current epoch, as Lightning adds it for the loggers (not into ``logged_metrics``), unless it holds
  a logged ``"step"``, which is then the row's step and not written as a metric (Lightning's rule);
- an evaluation batch's row is in ``logged_metrics`` after the call (not in ``callback_metrics``);
- the step is Lightning's: during ``fit`` the index of the last trained batch (the first batch's row
  is at 0; an epoch end and a validation are at their last batch's step); ``validate`` / ``test``
  outside a fit at the batches trained so far; an evaluation batch's own row at its loader's batch count in the stage.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainer.loggers import JSONLLogger

if TYPE_CHECKING:
    from trainer.loop.rank_run import RankRun


def write_row(run: RankRun, metrics: dict[str, float]) -> None:
    """Record ``metrics`` (training, epoch end, evaluation results) for the callbacks' view and
    write them with rank 0's loggers (see the module)."""
    hidden = run.module_logs.hidden  # self.log(..., logger=False): for the hooks and monitors only
    if not getattr(run.trainer, "lightning_rows", False):
        run.last_metrics.update(metrics)
        written = {k: v for k, v in metrics.items() if k not in hidden} if hidden else metrics
        for logger in run.loggers:
            logger.log_metrics(metrics=written, step=run.step)
        return
    own = run.module_logs.own_names
    shown = {k: v for k, v in metrics.items() if k not in own and k != "epoch"}
    run.last_metrics.update(shown)
    row = {k: v for k, v in shown.items() if k not in hidden}
    step = max(run.step - 1, 0) if run.fit_plan is not None else run.step
    if "step" in row:
        step = int(row.pop("step"))
    elif row:
        row["epoch"] = metrics.get("epoch", run.epoch)
    record = {k: v for k, v in metrics.items() if k not in hidden}
    for logger in run.loggers:
        if isinstance(logger, JSONLLogger):
            logger.log_metrics(metrics=record, step=run.step)
        elif row:
            logger.log_metrics(metrics=row, step=step)


def write_eval_step_row(run: RankRun, metrics: dict[str, float], step: int) -> None:
    """Write an evaluation batch's ``on_step`` values at ``step``, the batch's index among its loader's
    batches in the stage (Lightning's axis for them: each of several loaders counts from 0; see
    trainer/loop/eval_step_logs.py); none when all are ``logger=False``. ``callback_metrics`` keeps
    the pass's aggregates, not these."""
    hidden = run.module_logs.hidden
    written = {k: v for k, v in metrics.items() if k not in hidden} if hidden else metrics
    if getattr(run.trainer, "lightning_rows", False):
        # (Lightning's logged_metrics and progress_bar_metrics hold them, not callback_metrics; the
        # hidden ones are kept off logged_metrics when the call ends, as off the loggers)
        run.eval_step_values.update(metrics)
    for logger in run.loggers if written else ():
        logger.log_metrics(metrics=written, step=step)

