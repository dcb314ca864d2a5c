"""Weight initialisation, eager or from the meta device, with the same result either way.

A model built under ``torch.device("meta")`` has shapes but no storage. It is materialised one
unit at a time: allocate a unit's tensors (``to_empty``), initialise them, hand the unit to
``shard_unit`` (FSDP keeps only this rank's shard), go on. A rank never holds more than one
unit's full weights besides the root's own, so a model larger than a rank's memory can be built.

Who initialises, in ``modules()`` order, with the RNG seeded the same on every rank:
- a TrainModule that overrides ``init_weights(submodule)`` owns initialisation: the trainer calls
  it for every submodule after ``configure_model``, on eager builds too (seeded with
  ``derive_seed(seed, "init")``), so eager and meta builds are identical by construction;
- otherwise meta builds replay ``reset_parameters()`` of every submodule, seeded as
  ``configure_model`` was: that equals the eager build whenever the layers' constructors initialise
  through ``reset_parameters`` in registration order (all of torch.nn's layers do).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from trainer.runtime.seeding import derive_seed, seed_everything


def has_meta_tensors(module: nn.Module) -> bool:
    return any(t.is_meta for t in module.parameters()) or any(t.is_meta for t in module.buffers())


def _direct_tensors(module: nn.Module) -> list[torch.Tensor]:
    return list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))


def _owns_init(module: nn.Module) -> bool:
    from trainer.api.module import TrainModule

    return isinstance(module, TrainModule) and type(module).init_weights is not TrainModule.init_weights


class WeightInit:
    """Initialisation plan of one module for one run (see the module docstring).

    Args:
        module: the TrainModule, after ``configure_model``.
        seed: the seed ``configure_model`` ran under.
    """

    def __init__(self, module: nn.Module, seed: int):
        self.module = module
        self.owns_init = _owns_init(module)
        self.seed = derive_seed(seed, "init") if self.owns_init else seed

    def _init_one(self, submodule: nn.Module, name: str) -> None:
        # Initialise in fp32 and cast back: an eager build initialises in fp32 before the precision
        # plugin converts the model (bf16-true), and random draws in bf16 would differ.
        tensors = _direct_tensors(submodule)
        dtypes = [t.dtype for t in tensors]
        for t in tensors:
            if t.is_floating_point() and t.dtype != torch.float32 and not t.is_meta:
                t.data = t.data.float()
        try:
            self._init_in_place(submodule, name)
        finally:
            for t, dtype in zip(_direct_tensors(submodule), dtypes):
                if t.dtype != dtype:
                    t.data = t.data.to(dtype)

    def _init_in_place(self, submodule: nn.Module, name: str) -> None:
        if self.owns_init:
            self.module.init_weights(submodule)  # type: ignore[attr-defined]
            return
        reset = getattr(submodule, "reset_parameters", None)
        if callable(reset):
            reset()
        elif _direct_tensors(submodule):
            raise ValueError(
                f"meta-device init: submodule {name or '<root>'!r} ({type(submodule).__name__}) has parameters or "
                "buffers of its own but no reset_parameters(); give it one, or override "
                "TrainModule.init_weights(submodule) to initialise it"
            )

    def eager(self) -> None:
        """Run the module's own ``init_weights`` over an eagerly built model (no-op otherwise)."""
        if not self.owns_init:
            return
        with torch.no_grad():
            seed_everything(self.seed)
            for name, submodule in self.module.named_modules():
                self._init_one(submodule, name)

    def materialize(
        self,
        device: torch.device,
        units: list[nn.Module],
        shard_unit: Callable[[nn.Module], None],
        keep: Callable[[str], bool] | None = None,
    ) -> None:
        """Allocate and initialise the meta-device module unit by unit, calling ``shard_unit`` on
        each unit (children first) as soon as its whole subtree is initialised. The root is
        materialised but not passed to ``shard_unit``.

        ``keep(name)``: whether submodule ``name``'s own tensors stay; the others are initialised
        (their random draws keep every later layer's weights equal to one process's) and put back
        on the meta device at once, so a rank holds its kept tensors plus one submodule's."""
        # Where each unit's subtree ends in the pre-order walk; nested units end innermost first.
        ends: dict[str, list[nn.Module]] = {}
        unit_names = {id(m): n for n, m in self.module.named_modules() if any(m is u for u in units)}
        for unit in units:
            prefix = unit_names[id(unit)]
            last = list(unit.named_modules(prefix=prefix))[-1][0]
            ends.setdefault(last, []).append(unit)
        for group in ends.values():
            group.sort(key=lambda u: -unit_names[id(u)].count("."))
        with torch.no_grad():
            seed_everything(self.seed)
            for name, submodule in self.module.named_modules():
                if any(t.is_meta for t in _direct_tensors(submodule)):
                    submodule.to_empty(device=device, recurse=False)
                    self._init_one(submodule, name)
                    if keep is not None and not keep(name):
                        submodule.to_empty(device="meta", recurse=False)
                elif self.owns_init:
                    self._init_one(submodule, name)  # keep the RNG stream identical to the eager pass
                for unit in ends.get(name, []):
                    shard_unit(unit)
        if keep is None and has_meta_tensors(self.module):
            raise RuntimeError("meta-device init left tensors on the meta device (a module shared by two parents?)")
