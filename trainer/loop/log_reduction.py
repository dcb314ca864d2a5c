"""The reduction of what ``self.log`` collected (``log_collector.py``): a scope's values into one
number per name, on logging steps (``on_step`` values), at training-epoch ends and at the end of each
evaluation run (``on_epoch`` values, `LogReduction.epoch_metrics`), with one host read and a few
collectives.

Across ranks (``sync_dist=True``, our default): the names are agreed first (one object gather, and
only when some rank logged something), so a name logged on some ranks only is reduced over the
union (a rank that did not log it adds nothing) and never hangs a collective; the same name with a
different ``reduce_fx`` / ``sync_dist`` on two ranks is an error naming both. ``"mean"`` is the
sample-weighted mean over every rank's micro-batches (exact, independent of the world size),
``"sum"`` the sum, ``"max"`` / ``"min"`` the extreme. ``sync_dist=False`` keeps this rank's own
aggregate (rank 0's is the one the loggers write).

A torchmetrics object's epoch value is ``compute()``, which syncs the metric's own states over the
ranks (so it is not reduced again), after which every metric object the stage logged is reset.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from trainer.loop.log_aggregates import LogOptions, Scope
from trainer.runtime import distributed
from trainer.runtime.metric_objects import compute_value
from trainer.runtime.rank_logging import rank_zero_warn

log = logging.getLogger(__name__)


class LogReduction:
    """The reducing half of `LogCollector` (its base class): the
    epoch aggregates' reduction and reset, and the reduction of any scope over the ranks. It reads
    the collector's state, set in ``LogCollector.__init__``."""

    device: torch.device
    refused: str | None
    prog_bar: set[str]
    hidden: set[str]
    bare: dict[str, Any]
    _epochs: dict[str, Scope]
    _options: dict[str, dict[str, LogOptions]]
    _metrics: dict[str, dict[str, Any]]
    _known_metrics: dict[str, Any]
    _anyone_logs: bool
    _trainer_wrote: set[str]
    _reduced: set[str]

    def epoch_metrics(self, stage: str, strategy: Any) -> dict[str, float]:
        """The ``on_epoch`` values of ``stage`` since it began (or since its last epoch), reduced
        over the ranks (on every rank), metric objects computed; the aggregates start again empty
        and the stage's metric objects are reset."""
        scope = self._epochs.get(stage, Scope())
        self._epochs[stage] = Scope()
        self._reduced.add(stage)
        try:
            out = self._reduce(scope, strategy, "_epoch", always_agree=stage != "train", compute=True)
        finally:
            self._reset_metrics(stage)
        if stage == "train" and (both := sorted(self._trainer_wrote & set(out))):
            # A name first logged in an epoch-end hook: the trainer had written its own value under it at
            # this step already (from now on only the user's is written).
            rank_zero_warn(log, "self.log names %s, first logged at this epoch end, were also written by the trainer "
                           "at this step (its own values under those names); from now on only yours are written",
                           both)
        return out

    def discard(self, stage: str) -> None:
        """Drop what ``stage`` collected without logging it (a sanity pass): its aggregates and the
        state of the metric objects it logged, as if it had not run."""
        self._epochs[stage] = Scope()
        self._reset_metrics(stage)

    def _reset_metrics(self, stage: str) -> None:
        for metric in self._metrics.pop(stage, {}).values():
            metric.reset()

    def pending_epoch_values(self, stage: str) -> bool:
        """Whether ``stage`` holds on_epoch values not yet reduced (this rank)."""
        return bool(self._epochs.get(stage, Scope()).values)

    def _reduce(self, scope: Scope, strategy: Any, suffix: str, always_agree: bool = False,
                compute: bool = False) -> dict[str, float]:
        """Every name of ``scope`` (and, with sync_dist, of the other ranks' scopes) -> its value.
        ``suffix`` is added when the name is logged both on_step and on_epoch (Lightning's names).
        ``compute``: metric objects give their ``compute()`` (synced by the metric itself, so not
        reduced again); otherwise a metric's values are its forward values, reduced as any value."""
        if self.refused:
            return {}
        synced = {n: a.options for n, a in scope.values.items() if a.options.agreed}
        # Every rank takes part when any rank logged a synced name: a flag first (one tiny all-reduce),
        # then the names. A run that never calls self.log pays that flag on logging steps and evaluation
        # ends only (which make collectives anyway), where it also learns whether any rank has called
        # self.log; at training-epoch ends (no collective may be added there for nothing) the flag runs
        # once some rank is known to log synced values, or this rank does (ranks log alike from their
        # first step; one that starts alone before any logging step would wait for the others until
        # the collective timeout). Unsynced names (sync_dist=False, rank_zero_only) never count.
        logs_synced = self._logs_synced()
        if distributed.is_distributed() and (always_agree or logs_synced or self._anyone_logs):
            flag = torch.tensor([float(bool(synced)), float(logs_synced)], device=self.device)
            anyone_synced, anyone_logs = strategy.all_reduce_max(flag).tolist()  # (the reduction's host read)
            self._anyone_logs = self._anyone_logs or anyone_logs > 0
            if anyone_synced > 0:
                synced = self._agree(synced)
        computed = sorted(n for n, o in synced.items() if compute and o.metric)
        names = sorted(n for n, o in synced.items() if o.sync_dist and not (compute and o.metric))
        zero = torch.zeros((), dtype=torch.float64, device=self.device)
        sums, extremes = [], []  # all-reduced with sum / max (a min is the max of negatives)
        for name in names:
            aggregate = scope.values.get(name)
            fx = synced[name].reduce_fx
            total = zero if aggregate is None else zero + aggregate.total  # (a float becomes a tensor)
            if fx == "mean":
                sums += [total, zero + (0.0 if aggregate is None else aggregate.weight)]
            elif fx == "sum":
                sums.append(total)
            elif aggregate is None:
                extremes.append(torch.full((), -torch.inf, dtype=torch.float64, device=self.device))
            else:
                extremes.append(total if fx == "max" else -total)
        results: list[torch.Tensor] = []
        if sums:
            packed = strategy.all_reduce_sum(torch.stack(sums))
            results.append(packed)
        if extremes:
            results.append(strategy.all_reduce_max(torch.stack(extremes)))
        if computed:  # in one order on every rank: each compute() may gather the metric's states
            results.append(torch.stack([compute_value(n, self._metric_for(scope, n)).to(self.device) for n in computed]))
        local = [n for n, a in sorted(scope.values.items()) if not a.options.sync_dist and not (compute and a.options.metric)]
        local_values = []
        for name in local:
            aggregate = scope.values[name]
            total = zero + aggregate.total
            local_values.append(total / max(aggregate.weight, 1e-300) if aggregate.options.reduce_fx == "mean" else total)
        if local_values:
            results.append(torch.stack(local_values))
        flat = torch.cat(results).tolist() if results else []  # the one host read
        out: dict[str, float] = {}
        it = iter(flat)
        sum_values = [next(it) for _ in range(len(sums))]
        extreme_values = [next(it) for _ in range(len(extremes))]
        computed_values = [next(it) for _ in range(len(computed))]
        sum_iter, extreme_iter = iter(sum_values), iter(extreme_values)
        for name in names:
            fx = synced[name].reduce_fx
            if fx == "mean":
                total, weight = next(sum_iter), next(sum_iter)
                value = total / max(weight, 1e-300)
            elif fx == "sum":
                value = next(sum_iter)
            else:
                value = next(extreme_iter) * (1 if fx == "max" else -1)
            out[self._output_name(name, synced[name], suffix)] = value
        for name, value in zip(computed, computed_values):
            out[self._output_name(name, synced[name], suffix)] = value
        for name in local:
            out[self._output_name(name, scope.values[name].options, suffix)] = next(it)
        for name, options in {**{n: a.options for n, a in scope.values.items()}, **synced}.items():
            if options.on_step and options.on_epoch and suffixed(name, suffix) in out:
                self.bare[name] = out[suffixed(name, suffix)]
        return out

    def peek_epoch_metrics(self, stage: str, strategy: Any) -> dict[str, float]:
        """What `epoch_metrics` would give now, without consuming it: the aggregates and the
        metric objects stay (for ``callback_metrics`` inside ``on_train_epoch_end``, which shows the
        epoch's values in Lightning). A collective where the values are synced."""
        return self._reduce(self._epochs.get(stage, Scope()), strategy, "_epoch", always_agree=stage != "train",
                            compute=True)

    def _metric_for(self, scope: Scope, name: str) -> Any:
        """The metric object whose epoch value ``name`` is: this rank's, or (a rank that ran no batch
        of this stage) the object logged under that name earlier in the run."""
        aggregate = scope.values.get(name)
        metric = aggregate.metric if aggregate is not None else self._known_metrics.get(name)
        if metric is None:
            raise RuntimeError(f"self.log({name!r}, <metric>): other ranks logged this metric object, this rank never "
                               "did; log it on every rank")
        return metric

    def _logs_synced(self) -> bool:
        """Whether this rank has logged a synced name in this run."""
        return any(o.agreed for names in self._options.values() for o in names.values())

    def _agree(self, synced: dict[str, LogOptions]) -> dict[str, LogOptions]:
        """The union of the ranks' synced names; one name with other options on two ranks is an error."""
        per_rank = distributed.all_gather_object(synced)
        union: dict[str, LogOptions] = {}
        for rank, names in enumerate(per_rank):
            for name, options in names.items():
                first = union.setdefault(name, options)
                if (first.reduce_fx, first.sync_dist, first.metric) != (options.reduce_fx, options.sync_dist, options.metric):
                    owner = next(r for r, n in enumerate(per_rank) if name in n)
                    raise distributed.MetricKeyMismatch(
                        f"self.log({name!r}): rank {owner} logs it with reduce_fx={first.reduce_fx!r}, rank {rank} "
                        f"with reduce_fx={options.reduce_fx!r}; log one name the same way on every rank"
                    )
        return union

    def _output_name(self, name: str, options: LogOptions, suffix: str) -> str:
        out = suffixed(name, suffix) if options.on_step and options.on_epoch else name
        if options.prog_bar:
            self.prog_bar.add(out)
        if not options.logger:
            self.hidden.add(out)
        return out


def suffixed(name: str, suffix: str) -> str:
    """``name`` with ``_step`` / ``_epoch`` added before a ``/dataloader_idx_N`` ending (Lightning's
    ``loss_epoch/dataloader_idx_1``)."""
    head, mark, idx = name.rpartition("/dataloader_idx_")
    return f"{head}{suffix}{mark}{idx}" if mark and idx.isdigit() else name + suffix
