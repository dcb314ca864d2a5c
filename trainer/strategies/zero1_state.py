"""ZeRO-1 optimizer state in checkpoints: each rank saves and loads only the state it owns.

``ZeroRedundancyOptimizer`` keeps each parameter's optimizer state on one rank (its owner). A
checkpoint's optimizer entry has the layout-free form every strategy uses
(``torch.distributed.checkpoint.state_dict``: ``{"state": {<param name>: {<key>: value}},
"param_groups": [{..., "params": [<param name>, ...]}]}``, stored by DCP as
``optim.state.<param name>.<key>`` and ``optim.param_groups...``), so a ZeRO-1 checkpoint loads into
DDP, FSDP, one process or another world size, and theirs into ZeRO-1.

- ``sharded``: each rank hands DCP the live state tensors of the parameters it owns (no copy, no
  collective beyond DCP's own); loading asks DCP for exactly those entries and fills this rank's
  optimizer in place. No rank ever holds another rank's state.
- ``full``: rank 0 writes one file, so it receives the other ranks' state one tensor at a time
  (point to point from the owner); the other ranks hold their own shard plus the one tensor in
  flight. Loading: rank 0 reads the file and sends each tensor to its owner only.
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer.runtime import distributed
from trainer.optim.param_groups import keep_param_group_dicts

STATE, GROUPS, PARAMS = "state", "param_groups", "params"


def parameter_names(module: nn.Module) -> dict[nn.Parameter, str]:
    """Each parameter's checkpoint name: as ``torch.distributed.checkpoint.state_dict`` names it
    (wrapper prefixes such as ``_orig_mod.`` removed; a shared parameter under its first name)."""
    from torch.distributed.checkpoint.state_dict import _get_fqns

    names: dict[nn.Parameter, str] = {}
    for key, param in module.named_parameters():
        fqns = _get_fqns(module, key)
        if len(fqns) != 1:
            raise ValueError(f"parameter {key!r} has {len(fqns)} checkpoint names ({sorted(fqns)}); expected one")
        names[param] = next(iter(fqns))
    return names


def _owned(zero: Any) -> list[nn.Parameter]:
    """The parameters whose optimizer state lives on this rank, in the local optimizer's order."""
    return list(chain.from_iterable(group[PARAMS] for group in zero.optim.param_groups))


def _param_groups(optimizer: torch.optim.Optimizer, names: dict[nn.Parameter, str]) -> list[dict[str, Any]]:
    """The hyperparameters of every group (the same on every rank), parameters by name."""
    return [{**{k: v for k, v in group.items() if k != PARAMS}, PARAMS: [names[p] for p in group[PARAMS]]}
            for group in optimizer.param_groups]


def _apply_param_groups(zero: Any, optimizer: torch.optim.Optimizer, loaded: list[dict[str, Any]],
                        names: dict[nn.Parameter, str]) -> None:
    """Copy the loaded hyperparameters (learning rate, betas, ...) into the user's param-group dicts,
    which ZeRO shares (a scheduler writes the learning rate there), and on into this rank's optimizer.
    The dict objects stay the same ones."""
    if len(loaded) != len(optimizer.param_groups):
        raise ValueError(f"the checkpoint's optimizer has {len(loaded)} parameter groups, this one "
                         f"{len(optimizer.param_groups)}")
    for index, (group, saved) in enumerate(zip(optimizer.param_groups, loaded)):
        mine = [names[p] for p in group[PARAMS]]
        if list(saved.get(PARAMS, mine)) != mine:
            raise ValueError(f"the checkpoint's optimizer parameter group {index} holds other parameters than "
                             f"this one's: {list(saved[PARAMS])[:5]} vs {mine[:5]}")
        group.update({k: v for k, v in saved.items() if k != PARAMS})
    for exposed, local in zip(zero.param_groups, zero.optim.param_groups):
        local.update({k: v for k, v in exposed.items() if k != PARAMS})


def _allocate_state(optim: torch.optim.Optimizer) -> None:
    """Give every parameter of a fresh optimizer its state, as ``torch.distributed.checkpoint``
    does for any optimizer before a load (a step with zero gradients at learning rate 0, which
    leaves the parameters as they are), but one parameter at a time: at most one gradient and one
    step's temporaries beyond the state itself."""
    params = [p for group in optim.param_groups for p in group[PARAMS]]
    if optim.state or any(p.grad is not None for p in params):
        return  # already has state, or is mid-step: nothing to allocate (as torch decides)
    saved = [(group, group[PARAMS], group.get("lr")) for group in optim.param_groups]
    try:
        for group in optim.param_groups:
            group[PARAMS] = []
            if "lr" in group:
                group["lr"] = torch.tensor(0.0) if isinstance(group["lr"], torch.Tensor) else 0.0
        for group, group_params, _ in saved:
            for param in group_params:
                if param.requires_grad:
                    group[PARAMS] = [param]
                    param.grad = torch.zeros_like(param)
                    optim.step()
                    param.grad = None
            group[PARAMS] = []
    finally:
        for group, group_params, lr in saved:
            group[PARAMS] = group_params
            if lr is not None:
                group["lr"] = lr


# ----- sharded (torch.distributed.checkpoint): every rank its own entries -----------------------------------
def sharded_state_dict(zero: Any, module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """This rank's entries: the state of the parameters it owns (the live tensors: a DCP save writes
    them, a DCP load fills them in place) and every group's hyperparameters. A fresh optimizer
    (before a load) first gets its state allocated (``_allocate_state``)."""
    _allocate_state(zero.optim)
    names = parameter_names(module)
    state = {names[p]: zero.optim.state[p] for p in _owned(zero) if zero.optim.state.get(p)}
    return {STATE: state, GROUPS: _param_groups(optimizer, names)}


def load_sharded_state_dict(zero: Any, module: nn.Module, optimizer: torch.optim.Optimizer,
                            loaded: dict[str, Any]) -> None:
    """After DCP filled ``sharded_state_dict``'s tensors in place: take its hyperparameters."""
    _apply_param_groups(zero, optimizer, loaded[GROUPS], parameter_names(module))


# ----- full: gathered to / scattered from rank 0, one tensor at a time -------------------------------------
def _comm_device() -> torch.device:
    """Where tensors must be for point-to-point sends on the default group (NCCL: this GPU)."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _describe(entries: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Shapes and dtypes of the tensors (values of anything else) of ``{name: {key: value}}``."""
    def one(value: Any) -> tuple:
        return ("tensor", tuple(value.shape), value.dtype) if isinstance(value, torch.Tensor) else ("value", value)

    return {name: {key: one(value) for key, value in keys.items()} for name, keys in entries.items()}


def gather_full_state_dict(zero: Any, module: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The whole optimizer state on rank 0 (CPU tensors), ``{}`` on the other ranks. Each tensor
    travels from its owner to rank 0 alone; no rank but 0 ever holds more than its own shard plus
    the tensor it is sending. A collective."""
    names = parameter_names(module)
    rank, device = distributed.rank(), _comm_device()
    local = {names[p]: zero.optim.state[p] for p in _owned(zero) if zero.optim.state.get(p)}
    # What each rank owns (names, shapes, dtypes, scalars): small, so one object gather.
    described = distributed.all_gather_object(_describe(local))
    owner = {name: r for r, entries in enumerate(described) for name in entries}
    description = {name: entries[name] for entries in described for name in entries}
    state: dict[str, dict[str, Any]] = {}
    for name in (names[p] for group in optimizer.param_groups for p in group[PARAMS]):
        if name not in owner:  # no state yet (never had a gradient)
            continue
        source, gathered = owner[name], {}
        for key, (kind, *info) in description[name].items():
            if kind == "value":
                gathered[key] = info[0]
            elif source == 0:
                if rank == 0:
                    gathered[key] = local[name][key].detach().cpu()  # a copy only if it lives on a GPU
            elif rank == source:
                dist.send(local[name][key].detach().to(device).contiguous(), dst=0)
            elif rank == 0:
                shape, dtype = info
                buffer = torch.empty(shape, dtype=dtype, device=device)
                dist.recv(buffer, src=source)
                gathered[key] = buffer.cpu()
        if rank == 0:
            state[name] = gathered
    return {STATE: state, GROUPS: _param_groups(optimizer, names)} if rank == 0 else {}


def load_full_state_dict(zero: Any, module: nn.Module, optimizer: torch.optim.Optimizer,
                         loaded: dict[str, Any]) -> None:
    """Load a full optimizer state that only rank 0 has (``loaded``; ignored elsewhere): rank 0
    sends each tensor to the rank that owns its parameter, one at a time. A collective."""
    names = parameter_names(module)
    by_name = {name: param for param, name in names.items()}
    rank, device = distributed.rank(), _comm_device()
    groups, description = distributed.broadcast_object(
        (loaded[GROUPS], _describe(loaded[STATE])) if rank == 0 else None
    )
    unknown = sorted(set(description) - set(by_name))
    if unknown:
        raise ValueError(f"the checkpoint's optimizer has state for parameters this model does not have: {unknown[:5]}")
    _apply_param_groups(zero, optimizer, groups, names)  # checks the groups before any tensor moves
    owner_of = zero._param_to_rank
    mine: dict[nn.Parameter, dict[str, Any]] = {}
    for name, keys in description.items():
        param = by_name[name]
        target, received = owner_of[param], {}
        for key, (kind, *info) in keys.items():
            if kind == "value":
                received[key] = info[0]
            elif target == 0:
                if rank == 0:
                    received[key] = loaded[STATE][name][key]
            elif rank == 0:
                dist.send(loaded[STATE][name][key].to(device).contiguous(), dst=target)
            elif rank == target:
                shape, dtype = info
                buffer = torch.empty(shape, dtype=dtype, device=device)
                dist.recv(buffer, src=0)
                # A step counter stays on the CPU, as ZeRO keeps it.
                received[key] = buffer.cpu() if buffer.dim() == 0 else buffer
        if rank == target:
            mine[param] = received
    # The local optimizer's own load casts each tensor to its parameter's device and dtype as it
    # does for any optimizer; its param-group dicts are kept (ZeRO's partition shares them).
    index = {p: i for i, p in enumerate(_owned(zero))}
    local_groups = [{**{k: v for k, v in saved.items() if k != PARAMS}, PARAMS: [index[p] for p in group[PARAMS]]}
                    for saved, group in zip(groups, zero.optim.param_groups)]
    with keep_param_group_dicts(zero.optim):
        zero.optim.load_state_dict({STATE: {index[p]: value for p, value in mine.items()}, GROUPS: local_groups})
