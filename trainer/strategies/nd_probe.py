"""The tensor-parallel plan checked before any worker starts, on a meta-device copy of the model."""

from __future__ import annotations

import logging

import torch
from torch import nn

from trainer.strategies.tensor_parallel import expand_plan, module_plan

log = logging.getLogger(__name__)


def probe_copy(module: nn.Module) -> nn.Module:
    """A shallow copy of ``module`` with its own submodule, parameter and buffer tables, so that a
    ``configure_model`` run on it adds its layers to the copy only; no tensor is copied."""
    probe = type(module).__new__(type(module))
    probe.__dict__.update(module.__dict__)
    for table in ("_modules", "_parameters", "_buffers"):
        probe.__dict__[table] = type(module.__dict__[table])(module.__dict__[table])
    return probe


def check_plan_before_launch(module: nn.Module) -> None:
    """ValueError (one line) when ``module``'s ``tensor_parallel_plan()`` is malformed or names a
    submodule the built model does not have. The model is built by ``configure_model`` on a
    meta-device copy; a model that cannot be built there (its configure_model reads data, say) is
    checked by each rank at the start of the run instead."""
    if module_plan(module) is None:  # (checks the plan's shape)
        return
    try:
        probe = probe_copy(module)
        build = getattr(probe, "configure_model", None)
        if callable(build):
            with torch.device("meta"):  # the layers it builds hold no memory
                build()
    except Exception as error:  # noqa: BLE001 - the ranks check the plan on the real build
        log.debug("tensor-parallel plan not checked before launch: configure_model on the meta device failed: %s", error)
        return
    plan = module_plan(probe)
    if plan is not None:
        expand_plan(probe, plan)
