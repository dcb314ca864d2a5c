"""Lightning's Trainer names where they mean the same as ours, and clear errors for those that do not.

- ``precision``: Lightning's ``"32"``, ``"32-true"``, ``32``, ``"16-mixed"``, ``16``, ``"bf16-mixed"``,
  ``"bf16-true"`` map to ours (fp32 / fp16-mixed / bf16-mixed / bf16-true); ``"16"`` and ``"bf16"``
  too (Lightning 1.x spellings of the same).
- ``devices="auto"``: under torchrun / srun the launcher's processes per node; otherwise the number
  of CUDA devices when CUDA is used (``accelerator`` "auto" or "cuda" and a GPU present), else 1.
- ``strategy="auto"``: "single" for one process in all (devices x num_nodes == 1), else "ddp"
  (Python API; under ``train.py`` the strategy is a config group: ``strategy=single`` / ``strategy=ddp``).
  Lightning's other data-parallel names are "ddp" (``LIGHTNING_STRATEGIES``): "ddp_spawn", "ddp_fork",
  "ddp_notebook" (how Lightning starts its processes; here the trainer starts them itself, the training
  is the same) and their ``_find_unused_parameters_true`` / ``_false`` forms (``DDPStrategy``'s
  ``find_unused_parameters``); "single_device" is "single".
- Under ``train.py``: ``trainer.precision=16-mixed`` (any name above; the ``precision`` group keeps
  our names and the loss-scaler options), ``trainer.devices=auto``.
- ``accelerator="gpu"``: "cuda"; "mps", "tpu", "hpu" are refused (this trainer runs on cpu / cuda).
- An argument the Trainer does not take: an error naming ours where Lightning's name differs
  (``profiler=`` -> ``profile=``), else the closest of our names (difflib).
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable

#: Lightning's precision names (and our own) -> ours.
PRECISION_ALIASES: dict[Any, str] = {
    "32": "fp32", "32-true": "fp32", 32: "fp32", "fp32": "fp32",
    "16": "fp16-mixed", "16-mixed": "fp16-mixed", 16: "fp16-mixed", "fp16-mixed": "fp16-mixed",
    "bf16": "bf16-mixed", "bf16-mixed": "bf16-mixed", "bf16-true": "bf16-true",
}

#: Lightning Trainer arguments that exist here under another name, or not at all: what to use instead.
LIGHTNING_ARGUMENTS = {
    "ckpt_path": "Trainer.fit(model, ckpt_path=...) or resume=",
    "profiler": "profile= ({'wall_clock_breakdown': ..., 'trace_steps': [first, last], 'comms_steps': [first, last]})",
    "plugins": "strategy= / precision= (a Strategy or Precision instance)",
    "val_every_n_epochs": "check_val_every_n_epoch=",
    "every_n_train_steps": "checkpoint={'every_n_steps': N}",
    "reload_dataloaders_every_n_epochs": "trainer.lightning.Trainer(reload_dataloaders_every_n_epochs=N) (Lightning's "
                                         "Trainer; here the data hooks run once per call)",
    "use_distributed_sampler": "nothing: the trainer always spreads the samples over the ranks itself",
    "barebones": "progress_bar=False, loggers=[]",
    "sync_dist": "self.log(..., sync_dist=...) in the module, not a Trainer argument",
}


#: Lightning's accelerator names this trainer does not run on: what to use instead.
REFUSED_ACCELERATORS = ("mps", "tpu", "hpu", "xla", "ipu")


def accelerator_name(value: Any) -> Any:
    """``"gpu"`` (Lightning's) is ``"cuda"``; an accelerator this trainer does not run on is an error."""
    if value == "gpu":
        return "cuda"
    if isinstance(value, str) and value.lower() in REFUSED_ACCELERATORS:
        raise ValueError(f"trainer.accelerator={value!r} is not supported: this trainer runs on 'cpu' or 'cuda' "
                         "('gpu' and 'auto' mean cuda where there is one)")
    if not isinstance(value, str):
        raise ValueError(f"trainer.accelerator={value!r}: give 'auto', 'cpu', 'cuda' or 'gpu' (an Accelerator object "
                         "is Lightning's; here the strategy places the model: strategy=DDPStrategy(accelerator=...))")
    return value


def precision_name(value: Any) -> Any:
    """Our precision name for a Lightning (or our) name; other values are returned as they are."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (str, int)) and value in PRECISION_ALIASES:
        return PRECISION_ALIASES[value]
    return value


def check_precision(value: Any) -> None:
    """An error naming the allowed values for a precision that is neither ours nor Lightning's."""
    if value is None or not isinstance(value, (str, int)) or isinstance(value, bool):
        return  # a Precision instance or a dict of its fields: Precision.from_any checks it
    if value not in PRECISION_ALIASES:
        allowed = ", ".join(repr(k) for k in PRECISION_ALIASES)
        raise ValueError(f"trainer.precision={value!r} is not a precision; allowed: {allowed}")


def resolve_devices(devices: Any, accelerator: str, environment: Any = None, cuda_devices: int | None = None) -> Any:
    """``devices="auto"``: see the module docstring. Other values are returned as they are.
    ``cuda_devices``: the CUDA devices this process sees (None: torch's count)."""
    if devices != "auto":
        return devices
    if environment is not None and environment.external:
        return environment.local_world_size
    if cuda_devices is None:
        import torch

        cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if accelerator in ("auto", "cuda") and cuda_devices > 0:
        return cuda_devices
    return 1


def _lightning_strategies() -> dict[str, tuple[str, dict[str, Any]]]:
    names: dict[str, tuple[str, dict[str, Any]]] = {"single_device": ("single", {})}
    for launch in ("ddp", "ddp_spawn", "ddp_fork", "ddp_notebook"):
        names[launch] = ("ddp", {})
        for value in ("true", "false"):
            names[f"{launch}_find_unused_parameters_{value}"] = ("ddp", {"find_unused_parameters": value == "true"})
    return names


#: Lightning's CPU strategy names -> (our name, the strategy's options).
LIGHTNING_STRATEGIES = _lightning_strategies()


def resolve_strategy_name(strategy: Any, devices: Any, num_nodes: Any) -> tuple[Any, dict[str, Any]]:
    """``(strategy, options)``: "auto" is "single" for one process in all, "ddp" for several;
    Lightning's names map to ours (``LIGHTNING_STRATEGIES``); anything else is returned as it is."""
    if isinstance(strategy, str) and strategy in LIGHTNING_STRATEGIES:
        return LIGHTNING_STRATEGIES[strategy]
    if strategy != "auto":
        return strategy, {}
    if isinstance(devices, int) and isinstance(num_nodes, int) and devices * num_nodes > 1:
        return "ddp", {}
    return "single", {}


def unknown_argument_error(unknown: Iterable[str], function: Any, where: str = "Trainer") -> TypeError:
    """The error for arguments ``function`` does not take: Lightning's name -> ours, or the closest names."""
    import inspect

    known = [name for name, p in inspect.signature(function).parameters.items()
             if name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]
    parts = []
    for name in unknown:
        if name in LIGHTNING_ARGUMENTS:
            parts.append(f"{name!r} (Lightning's) is not a {where} argument here; use {LIGHTNING_ARGUMENTS[name]}")
            continue
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(close)}?" if close else f"the arguments are {', '.join(known)}"
        parts.append(f"{name!r} is not a {where} argument; {hint}")
    return TypeError("; ".join(parts))
