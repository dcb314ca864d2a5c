"""The sanity validation before training (``trainer.num_sanity_val_steps``, Lightning's default 2):
a broken ``validation_step`` fails before the first optimizer step instead of at the first
validation, possibly hours later.

It must not change the training stream: the random states a validation step could draw from
(Python's, NumPy's, torch's on the CPU and on every CUDA device) are saved before and restored
after, and the validation data have their own seeds (``derive_seed(seed, "val", ...)``), so the
sample order and the losses are bitwise those of a run without it; the module's metric objects
(torchmetrics) are put back as they were too. The validation hooks run as in any pass, between
``on_sanity_check_start`` and ``on_sanity_check_end`` (``trainer.sanity_checking`` is True meanwhile,
as Lightning); nothing is logged and nothing is reduced across ranks (no collective but the forwards'
own under FSDP).
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any

import torch

from trainer.loop.run_limits import disables
from trainer.loop.validation import run_validation
from trainer.runtime.metric_objects import MetricStates, module_metrics

if TYPE_CHECKING:
    from trainer.loop.rank_run import RankRun

log = logging.getLogger(__name__)


def random_states() -> dict[str, Any]:
    states: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy

        states["numpy"] = numpy.random.get_state()
    except ImportError:  # pragma: no cover
        pass
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_random_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])
    if "numpy" in states:
        import numpy

        numpy.random.set_state(states["numpy"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


def sanity_pass_follows(trainer: Any) -> bool:
    """Whether a fit with these settings runs a sanity pass (given validation data)."""
    return trainer.stage == "fit" and trainer.num_sanity_val_steps != 0 and not disables(trainer.limit_val_batches)


def run_sanity_check(run: RankRun) -> None:
    """Run ``num_sanity_val_steps`` validation batches (-1: all), leaving every random state as it was.
    Skipped without validation data or under ``limit_val_batches=0``; a resumed run has one too (as Lightning)."""
    batches = run.trainer.num_sanity_val_steps
    if batches == 0 or run.val_set is None or disables(run.trainer.limit_val_batches):
        return
    with run.stage("sanity_check", sanity=True):  # (for its hooks too)
        _sanity_pass(run, batches)
    log.info("sanity check: %s validation batch(es) ran", "all" if batches == -1 else batches)


def _sanity_pass(run: RankRun, batches: int) -> None:
    states = random_states()
    run.hooks.call("on_sanity_check_start")
    # The module's metric objects too: what the pass fed them, logged or not, must not count in the
    # first validation.
    metrics = MetricStates(module_metrics(run.module))
    # Its metrics are in callback_metrics for its own hooks only (as Lightning), then taken out again.
    shown, bare = dict(run.last_metrics), dict(run.module_logs.bare)
    try:
        run_validation(run, sanity_batches=batches)
    finally:
        restore_random_states(states)
        metrics.restore()
        run.last_metrics.clear()
        run.last_metrics.update(shown)
        run.module_logs.bare.clear()
        run.module_logs.bare.update(bare)
    run.hooks.call("on_sanity_check_end")
