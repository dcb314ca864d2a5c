"""``self.log`` / ``self.log_dict``: the module's logging methods (argument checks; the values go to the
run's collector in ``trainer/loop/log_collector.py``, which reduces and writes them).

A mixin of ``TrainModule``; the hook that logged is found from the caller's frames
(trainer/loop/log_hooks.py).
"""

from __future__ import annotations

from typing import Any

import warnings

import torch

from trainer.api.errors import MisconfigurationException
from trainer.runtime.metric_objects import collection_items, is_metric, is_metric_collection


#: the functions ``reduce_fx`` may be, by the reduction's name (Lightning accepts them as the names)
_REDUCTION_FUNCTIONS = {torch.mean: "mean", torch.sum: "sum", sum: "sum", torch.max: "max", max: "max",
                        torch.min: "min", min: "min"}


def reduction_name(reduce_fx: Any) -> Any:
    """``reduce_fx`` as the collector's name for it ("mean", "sum", "max", "min"): Lightning's
    spellings (any case, "avg") and functions mapped; anything else is returned as given, for the
    collector to refuse with the list of reductions."""
    if isinstance(reduce_fx, str):
        lowered = reduce_fx.lower()
        return "mean" if lowered == "avg" else lowered
    try:
        return _REDUCTION_FUNCTIONS.get(reduce_fx, reduce_fx)
    except TypeError:  # (an unhashable value)
        return reduce_fx


def _check_metric_attribute(module: Any, name: str, metric: Any) -> None:
    """A logged ``Metric`` must be one of ``module``'s attributes (its state is saved and restored with
    the module's, as Lightning requires); the attributes found are cached on the module."""
    found = module.__dict__.get("_metric_attributes")
    if found is None or id(metric) not in found:
        found = {id(child): child_name for child_name, child in module.named_modules() if is_metric(child)}
        module.__dict__["_metric_attributes"] = found
    if id(metric) in found:
        return
    what = f"self.log({name!r}, <{type(metric).__name__}>): the metric is not an attribute of {type(module).__name__}"
    if not found:
        raise MisconfigurationException(f"{what}; fix this by setting an attribute for the metric in your "
                                        "LightningModule (self.metric = ...) and logging that attribute")
    raise MisconfigurationException(f"{what}; log one of its metric attributes, or call "
                                    f"`self.log({name}, ..., metric_attribute=name)` where `name` is one of "
                                    f"{list(found.values())}")


class ModuleLogMethods:
    """``log`` and ``log_dict`` of `TrainModule` (Lightning's signatures)."""

    def log(self, name: str, value: Any, on_step: bool | None = None, on_epoch: bool | None = None,
            prog_bar: bool = False, logger: bool = True, reduce_fx: str = "mean", sync_dist: bool | None = None,
            batch_size: int | None = None, rank_zero_only: bool = False, enable_graph: bool = False,
            add_dataloader_idx: bool = True, sync_dist_group: Any = None, metric_attribute: str | None = None) -> None:
        """Log ``value`` (a Python number, a one-element tensor or a torchmetrics ``Metric``) under
        ``name``, kept as given (no prefix), from the hooks Lightning logs from (module and callback
        hooks; their table and defaults: trainer/loop/log_hooks.py). As Lightning's: ``on_step``
        (default True in training steps and batch hooks) writes it on logging steps (every
        ``log_every_n_steps``), ``on_epoch`` (default True elsewhere) aggregates it over the epoch /
        the evaluation run; both: ``name_step`` and ``name_epoch``. ``reduce_fx``: "mean" (weighted by
        ``batch_size``, default the batch's real samples), "sum", "max", "min" (as Lightning, in any
        case, "avg" for "mean", or the functions ``torch.mean`` / ``sum`` / ``max`` / ``min``, builtin or torch's). ``sync_dist`` (default
        True, Lightning's is False): reduced exactly over the ranks; False: this rank's value (rank
        0's is written). A ``Metric``: its forward value of the batch on steps, its ``compute()`` at
        the epoch end (the metric syncs its own states over the ranks), after which it is reset.
        ``prog_bar``: shown in the progress bar; ``logger=False``: only in
        ``trainer.callback_metrics`` (and the hooks' metrics). ``rank_zero_only=True``: logged by
        rank 0 alone (not synced). ``add_dataloader_idx``: with several test loaders a name logged in a step or batch hook gets
        ``/dataloader_idx_N`` (False: kept as given);
        ``metric_attribute`` names the module attribute holding a logged ``Metric`` (checked, else
        unused); ``enable_graph=True`` and ``sync_dist_group`` are refused (values are detached and
        reduced over the data-parallel ranks)."""
        trainer = self.__dict__.get("_trainer")
        if getattr(trainer, "barebones", False):  # Lightning's Trainer(barebones=True): no logging
            warnings.warn(f"self.log({name!r}) logs nothing: `Trainer(barebones=True)` is configured, which runs "
                          "without logging (it costs speed); build the Trainer without barebones=True to log",
                          stacklevel=2)
            return
        if add_dataloader_idx and isinstance(name, str) and "/dataloader_idx_" in name:
            raise MisconfigurationException(
                f"You called `self.log` with the key `{name}`: with add_dataloader_idx=True the trainer adds "
                "'/dataloader_idx_N' itself where several loaders run; log the name without it (or pass "
                "add_dataloader_idx=False)")
        if enable_graph is not False:
            raise ValueError(f"self.log({name!r}, enable_graph={enable_graph!r}): logged values are detached; "
                             "remove enable_graph")
        if sync_dist_group is not None:
            raise ValueError(f"self.log({name!r}, sync_dist_group=...): values are reduced over the data-parallel "
                             "ranks; remove sync_dist_group")
        if metric_attribute is not None and getattr(self, str(metric_attribute), None) is not value:
            raise ValueError(f"self.log({name!r}, metric_attribute={metric_attribute!r}): that attribute of "
                             f"{type(self).__name__} is not the logged value; name the attribute holding the Metric, "
                             "or leave metric_attribute out")
        if not isinstance(add_dataloader_idx, bool) or not isinstance(rank_zero_only, bool):
            raise TypeError(f"self.log({name!r}): add_dataloader_idx and rank_zero_only take True or False")
        if rank_zero_only and sync_dist:
            raise ValueError(f"self.log({name!r}, rank_zero_only=True, sync_dist=True): a value logged by rank 0 "
                             "alone cannot be reduced over the ranks; drop sync_dist")
        if rank_zero_only and is_metric(value):
            raise ValueError(f"self.log({name!r}, <{type(value).__name__}>, rank_zero_only=True): a Metric syncs its "
                             "states over every rank when computed; drop rank_zero_only")
        if metric_attribute is None and is_metric(value):
            _check_metric_attribute(self, name, value)
        collector = getattr(self, "_log_collector", None)
        if collector is None:
            raise RuntimeError(f"self.log({name!r}) outside a run: {type(self).__name__} is not being fitted, "
                               "validated or tested")
        from trainer.runtime import distributed
        from trainer.runtime.tensors import full_value

        # A DTensor is logged as its whole value, as the step hooks' returned ones are; on every rank of its
        # mesh (a collective), before rank_zero_only leaves the others out.
        value = full_value(value)
        if rank_zero_only and distributed.rank() != 0:
            return
        collector.log(name, value, on_step=on_step, on_epoch=on_epoch, prog_bar=prog_bar, logger=logger,
                      reduce_fx=reduction_name(reduce_fx), sync_dist=not rank_zero_only if sync_dist is None else sync_dist,
                      batch_size=batch_size, add_dataloader_idx=add_dataloader_idx)

    def log_dict(self, dictionary: Any, **options: Any) -> None:
        """``self.log(name, value, **options)`` for each item of ``dictionary``: a mapping of names to
        values (numbers, tensors, Metrics), or a torchmetrics ``MetricCollection`` (each of its metrics
        under its name with the collection's prefix / postfix)."""
        if is_metric_collection(dictionary):
            items = collection_items(dictionary)
        elif hasattr(dictionary, "items"):
            items = list(dictionary.items())
        else:
            raise TypeError(f"self.log_dict takes a mapping of name -> value or a MetricCollection, got "
                            f"{type(dictionary).__name__}")
        for name, value in items:
            self.log(name, value, **options)
