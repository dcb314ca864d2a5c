"""Record every hook call of a Lightning program, in order, into one list.

Two recorders share one :class:`TraceSink`: the tracing callback (tests/support/lightning_programs/
trace_callback.py: a Callback defining every Callback hook) and :func:`instrument`, which wraps the
hook methods of a module or DataModule instance. A record is ``(role, hook, arguments)``: ``arguments``
keeps the scalar arguments the hook was given (``stage``, ``batch_idx``, ``dataloader_idx``, ...), so
two runs that call the same hooks with other stages or batch indices differ; ``role`` is "callback",
"module" or "datamodule", with :data:`FRAMEWORK_MARK` where the program does not define the hook.

Nothing here imports Lightning or the trainer: the same code traces a program under both.
Under spawned ranks each rank appends its records to ``<directory>/trace-rank<R>.jsonl`` (the caller
reads them back with :func:`read_rank_trace`).
"""

from __future__ import annotations

import enum
import inspect
import json
import math
import os
from typing import Any

import torch

#: the hooks (and step methods) of a LightningModule that the trainer calls
MODULE_HOOKS = (
    "prepare_data", "setup", "teardown", "configure_callbacks", "configure_model", "configure_sharded_model",
    "configure_optimizers",
    "train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader",
    "transfer_batch_to_device", "on_before_batch_transfer", "on_after_batch_transfer",
    "on_fit_start", "on_fit_end",
    "on_train_start", "on_train_end", "on_validation_start", "on_validation_end",
    "on_test_start", "on_test_end", "on_predict_start", "on_predict_end",
    "on_train_epoch_start", "on_train_epoch_end", "on_validation_epoch_start", "on_validation_epoch_end",
    "on_test_epoch_start", "on_test_epoch_end", "on_predict_epoch_start", "on_predict_epoch_end",
    "on_train_batch_start", "on_train_batch_end", "on_validation_batch_start", "on_validation_batch_end",
    "on_test_batch_start", "on_test_batch_end", "on_predict_batch_start", "on_predict_batch_end",
    "on_validation_model_zero_grad", "on_validation_model_eval", "on_validation_model_train",
    "on_test_model_eval", "on_test_model_train", "on_predict_model_eval",
    "on_before_zero_grad", "on_before_backward", "backward", "on_after_backward", "on_before_optimizer_step",
    "configure_gradient_clipping", "optimizer_step", "optimizer_zero_grad", "lr_scheduler_step",
    "training_step", "validation_step", "test_step", "predict_step",
    "on_save_checkpoint", "on_load_checkpoint",
)

#: the hooks of a LightningDataModule that the trainer calls
DATAMODULE_HOOKS = (
    "prepare_data", "setup", "teardown",
    "train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader",
    "transfer_batch_to_device", "on_before_batch_transfer", "on_after_batch_transfer",
    "state_dict", "load_state_dict", "on_save_checkpoint", "on_load_checkpoint", "on_exception",
)

#: every hook of a Callback: the parameters after ``(self, trainer, pl_module)`` as Lightning names them
#: (``state_dict`` / ``load_state_dict`` take no trainer and module); ``name=0``: a default of 0
CALLBACK_HOOKS = {
    "setup": ("stage",), "teardown": ("stage",),
    "on_fit_start": (), "on_fit_end": (), "on_sanity_check_start": (), "on_sanity_check_end": (),
    "on_train_batch_start": ("batch", "batch_idx"), "on_train_batch_end": ("outputs", "batch", "batch_idx"),
    "on_train_epoch_start": (), "on_train_epoch_end": (),
    "on_validation_epoch_start": (), "on_validation_epoch_end": (),
    "on_test_epoch_start": (), "on_test_epoch_end": (), "on_predict_epoch_start": (), "on_predict_epoch_end": (),
    "on_validation_batch_start": ("batch", "batch_idx", "dataloader_idx=0"),
    "on_validation_batch_end": ("outputs", "batch", "batch_idx", "dataloader_idx=0"),
    "on_test_batch_start": ("batch", "batch_idx", "dataloader_idx=0"),
    "on_test_batch_end": ("outputs", "batch", "batch_idx", "dataloader_idx=0"),
    "on_predict_batch_start": ("batch", "batch_idx", "dataloader_idx=0"),
    "on_predict_batch_end": ("outputs", "batch", "batch_idx", "dataloader_idx=0"),
    "on_train_start": (), "on_train_end": (), "on_validation_start": (), "on_validation_end": (),
    "on_test_start": (), "on_test_end": (), "on_predict_start": (), "on_predict_end": (),
    "on_exception": ("exception",),
    "state_dict": None, "load_state_dict": None,
    "on_save_checkpoint": ("checkpoint",), "on_load_checkpoint": ("checkpoint",),
    "on_before_backward": ("loss",), "on_after_backward": (), "on_before_optimizer_step": ("optimizer",),
    "on_before_zero_grad": ("optimizer",),
}


def callback_signature(name: str) -> inspect.Signature:
    """The signature of Lightning's ``Callback.<name>`` (from :data:`CALLBACK_HOOKS`: spawned ranks
    that build the tracer need not import Lightning)."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    parameters = [inspect.Parameter("self", kind)]
    rest = CALLBACK_HOOKS[name]
    if rest is None:  # state_dict(self), load_state_dict(self, state_dict)
        rest = ("state_dict",) if name == "load_state_dict" else ()
    else:
        parameters += [inspect.Parameter("trainer", kind), inspect.Parameter("pl_module", kind)]
    for spec in rest:
        parameter, _, default = spec.partition("=")
        parameters.append(inspect.Parameter(parameter, kind, default=int(default) if default else inspect.Parameter.empty))
    return inspect.Signature(parameters)


#: the callback hooks at which the tracer also takes the numbers: ``trainer.callback_metrics`` and,
#: at a train batch's end, the loss the step returned
VALUE_HOOKS = ("on_train_batch_end", "on_train_epoch_end", "on_validation_end", "on_test_end", "on_fit_end")

#: where a hook the program does not define comes from (the base classes of either side, torch)
FRAMEWORK_PACKAGES = ("lightning", "pytorch_lightning", "lightning_utilities", "trainer", "torch")
#: appended to the role of a call of a module / DataModule hook that the program does not define: the
#: base class's default. Lightning calls such defaults, this trainer skips a hook nobody overrides: the
#: comparison leaves them out (calling a default or not cannot change what a program computes).
FRAMEWORK_MARK = "*"

#: the objects a hook is given that are not recorded (the run itself)
_NOT_RECORDED = ("self", "trainer", "pl_module")


def scalar_arguments(signature: inspect.Signature | None, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The arguments that are plain scalars (str, int, float, bool, None), by parameter name, as
    given (defaults the caller left out are not filled in)."""
    if signature is None:
        return {}
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:  # the hook was called with arguments its signature does not take: record that
        return {"<unbindable>": f"{len(args)} positional, keywords {sorted(kwargs)}"}
    kept = {}
    for name, value in bound.arguments.items():
        if name in _NOT_RECORDED:
            continue
        if isinstance(value, enum.Enum):  # Lightning's stage is a str enum: record the plain string
            value = value.value
        if isinstance(value, str):
            kept[name] = str.__str__(value)
        elif value is None or isinstance(value, (int, float, bool)):
            kept[name] = value
    return kept


def to_number(value: Any) -> float | None:
    """A logged value as a float (a one-element tensor or a Python number); None for anything else."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.detach().float().cpu())
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def metrics_snapshot(metrics: Any) -> dict[str, float]:
    """``trainer.callback_metrics`` as ``{name: float}`` (names whose value is not a number are left out)."""
    snapshot = {}
    for name, value in dict(metrics or {}).items():
        number = to_number(value)
        if number is not None:
            snapshot[str(name)] = number
    return snapshot


def returned_loss(outputs: Any) -> float | None:
    """The loss a training step returned (a tensor or ``{"loss": tensor}``), as a float."""
    if isinstance(outputs, dict):
        outputs = outputs.get("loss")
    return to_number(outputs)


def current_rank() -> int:
    """This process's rank in the default process group (0 without one)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0


class TraceSink:
    """The one list both recorders append to, plus the numbers taken at :data:`VALUE_HOOKS`.

    Args:
        directory: where spawned ranks append their records (``trace-rank<R>.jsonl``); None keeps them
            in this process only.
    """

    def __init__(self, directory: str | None = None):
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.values: list[tuple[str, dict[str, float]]] = []
        self.directory = directory

    def record(self, role: str, hook: str, arguments: dict[str, Any]) -> None:
        self.calls.append((role, hook, arguments))
        self._append({"call": [role, hook, arguments]})

    def record_values(self, hook: str, values: dict[str, float]) -> None:
        self.values.append((hook, values))
        self._append({"values": [hook, values]})

    def _append(self, entry: dict[str, Any]) -> None:
        # One line per record, appended: a rank started for fit and another started for test (each
        # with its own copy of this sink) add to one file, in the order the calls happened.
        if self.directory is None:
            return
        os.makedirs(self.directory, exist_ok=True)
        with open(os.path.join(self.directory, f"trace-rank{current_rank()}.jsonl"), "a") as f:
            f.write(json.dumps(entry) + "\n")


def read_rank_trace(directory: str, rank: int = 0) -> TraceSink:
    """The records one rank wrote, in order (see :class:`TraceSink`); the caller's own records count
    as rank 0's."""
    sink = TraceSink()
    with open(os.path.join(directory, f"trace-rank{rank}.jsonl")) as f:
        for line in f:
            entry = json.loads(line)
            if "call" in entry:
                sink.calls.append(tuple(entry["call"]))
            else:
                sink.values.append(tuple(entry["values"]))
    return sink


class TracedHook:
    """A hook method of one instance that records each call into a :class:`TraceSink`, then runs the
    method of the instance's class. It keeps the method's signature (``__wrapped__``), so code that
    inspects the hook (is it overridden? does it take ``dataloader_idx``?) sees the original, and it
    pickles (a spawned rank gets the traced instance)."""

    def __init__(self, owner: Any, name: str, role: str, sink: TraceSink):
        self.owner, self.name, self.role, self.sink = owner, name, role, sink

    @property
    def __wrapped__(self) -> Any:
        return getattr(type(self.owner), self.name).__get__(self.owner)

    @property
    def __func__(self) -> Any:
        return getattr(type(self.owner), self.name)

    @property
    def __self__(self) -> Any:
        return self.owner

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        method = self.__wrapped__
        try:
            signature = inspect.signature(method)
        except (TypeError, ValueError):
            signature = None
        role = self.role if defined_by_program(type(self.owner), self.name) else self.role + FRAMEWORK_MARK
        self.sink.record(role, self.name, scalar_arguments(signature, args, kwargs))
        return method(*args, **kwargs)


def defined_by_program(cls: type, name: str) -> bool:
    """Whether ``cls.<name>`` is the program's own (not the framework's default, nor torch's)."""
    module = getattr(getattr(cls, name, None), "__module__", None) or ""
    return module.split(".")[0] not in FRAMEWORK_PACKAGES


def instrument(obj: Any, sink: TraceSink, role: str, hooks: tuple[str, ...]) -> Any:
    """Wrap each of ``hooks`` that ``obj`` has (its class's method) with a :class:`TracedHook`; returns ``obj``."""
    for name in hooks:
        method = getattr(type(obj), name, None)
        if callable(method):
            # into the instance's __dict__: nn.Module's __setattr__ is not involved, and an instance
            # attribute wins over the class's method
            obj.__dict__[name] = TracedHook(obj, name, role, sink)
    return obj


def format_calls(calls: list[tuple[str, str, dict[str, Any]]]) -> str:
    """One call a line: ``role.hook(name=value, ...)``."""
    lines = []
    for role, hook, arguments in calls:
        shown = ", ".join(f"{name}={value!r}" for name, value in arguments.items())
        lines.append(f"{role}.{hook}({shown})")
    return "\n".join(lines) + "\n"


def close(a: float, b: float, rtol: float) -> bool:
    """``a`` and ``b`` equal to ``rtol`` (and both NaN counts as equal)."""
    if math.isnan(a) and math.isnan(b):
        return True
    return abs(a - b) <= rtol * max(abs(a), abs(b)) + 1e-8
