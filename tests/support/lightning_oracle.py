"""Lightning as the oracle: run one program of tests/support/lightning_programs/ under Lightning itself
and under this trainer (the same file, its import lines rewritten), and compare what they did.

Each program has ``main(root_dir, devices, strategy, callbacks, instrument)``: it builds its objects
(passing each module and DataModule through ``instrument``), fits, and returns a dict of what it got
(the fitted module, the lists validate / test / predict returned, ...). :func:`run_program` runs it with
a tracing callback and instrumented hooks (tests/support/lightning_trace.py) and returns a
:class:`ProgramRun`: the hook calls in order, the numbers taken at the value hooks, and the results
flattened to tensors, so that :func:`assert_same_calls` / :func:`assert_same_numbers` compare runs.
"""

from __future__ import annotations

import contextlib
import enum
import importlib
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tests.support.lightning_trace import (
    DATAMODULE_HOOKS, FRAMEWORK_MARK, MODULE_HOOKS, TraceSink, close, format_calls, instrument, read_rank_trace,
)

#: where each side's programs come from: as written, or with the imports rewritten to trainer.lightning
PACKAGES = {"lightning": "tests.support.lightning_programs", "ours": "tests.support.lightning_as_ours"}

#: the programs of our own (module names in tests/support/lightning_programs/)
PROGRAMS = ("classifier_metrics", "datamodule_world", "checkpoint_plateau", "partial_optimizer", "manual_gan")


def load_program(name: str, side: str) -> Any:
    """The program module ``name`` as ``side`` ("lightning" or "ours") imports it."""
    return importlib.import_module(f"{PACKAGES[side]}.{name}")


@dataclass
class ProgramRun:
    """What one run of a program did."""

    calls: list[tuple[str, str, dict[str, Any]]]
    values: list[tuple[str, dict[str, float]]]
    results: dict[str, Any]
    numbers: dict[str, torch.Tensor | str] = field(default_factory=dict)

    def hook_sequence(self) -> str:
        return format_calls(self.calls)


@contextlib.contextmanager
def _process_state_kept():
    """Undo what a run changes in this process beyond its own objects: environment variables
    (Lightning's ``seed_everything`` exports one) and torch's determinism switch."""
    environment = dict(os.environ)
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(environment)
        torch.use_deterministic_algorithms(deterministic)


def run_program(name: str, side: str, root_dir: str, devices: int = 1, strategy: str = "auto",
                extra_callbacks: tuple = ()) -> ProgramRun:
    """Run program ``name`` under ``side`` with a tracing callback and traced module / DataModule hooks
    (and ``extra_callbacks``, untraced).

    With ``devices > 1`` (our trainer spawns the ranks) the records are rank 0's, read from its files.
    """
    program = load_program(name, side)
    tracer = load_program("trace_callback", side)
    trace_directory = os.path.join(str(root_dir), "hook-trace") if devices > 1 else None
    sink = TraceSink(trace_directory)

    def traced(obj):
        if isinstance(obj, nn.Module):
            return instrument(obj, sink, "module", MODULE_HOOKS)
        return instrument(obj, sink, "datamodule", DATAMODULE_HOOKS)

    with _process_state_kept():
        results = program.main(str(root_dir), devices=devices, strategy=strategy,
                               callbacks=[tracer.HookTracer(sink), *extra_callbacks], instrument=traced)
    if trace_directory is not None:
        sink = read_rank_trace(trace_directory, rank=0)
    numbers: dict[str, torch.Tensor | str] = {}
    flatten("", results, numbers)
    return ProgramRun(calls=sink.calls, values=sink.values, results=results, numbers=numbers)


def flatten(prefix: str, value: Any, out: dict[str, torch.Tensor | str]) -> None:
    """``value`` (results as a program returns them) as ``{path: tensor or string}``: modules by their
    state dict, dicts and lists by key and index, numbers as tensors."""
    if isinstance(value, nn.Module):
        for key, tensor in value.state_dict().items():
            out[f"{prefix}.{key}"] = _full(tensor)
    elif isinstance(value, torch.Tensor):
        out[prefix] = _full(value)
    elif isinstance(value, dict):
        for key, item in value.items():
            flatten(f"{prefix}/{key}" if prefix else str(key), item, out)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            flatten(f"{prefix}[{index}]", item, out)
    elif isinstance(value, enum.Enum):  # Lightning's stages are str enums: their plain value
        out[prefix] = repr(value.value)
    elif isinstance(value, bool) or value is None or isinstance(value, str):
        out[prefix] = repr(value)
    elif isinstance(value, (int, float)):
        out[prefix] = torch.tensor(float(value), dtype=torch.float64)
    else:
        out[prefix] = f"<{type(value).__name__}>"


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """A plain CPU tensor (a DTensor's full value)."""
    if hasattr(tensor, "full_tensor"):
        tensor = tensor.full_tensor()
    return tensor.detach().cpu().clone()


#: the hooks a checkpoint save calls
SAVE_HOOKS = ("state_dict", "on_save_checkpoint")


def compared_calls(run: ProgramRun, ignore: tuple[str, ...] = ()) -> list[tuple[str, str, dict[str, Any]]]:
    """The calls a comparison looks at: every callback hook, and the module / DataModule hooks the
    program defines (a default hook is called by Lightning and skipped by this trainer: either way it
    does nothing); ``ignore``: hook names left out. A save's hooks repeated right after the same save
    count once: Lightning's ``ModelCheckpoint(save_last=True)`` writes ``last.ckpt`` as a second file at
    the same step, calling them again; here "last" is that same checkpoint."""
    calls = [call for call in run.calls if not call[0].endswith(FRAMEWORK_MARK) and call[1] not in ignore]
    kept: list = []
    index = 0
    while index < len(calls):
        end = index
        while end < len(calls) and calls[end][1] in SAVE_HOOKS:
            end += 1
        if end > index:
            group = calls[index:end]
            size = len(group) // 2
            if len(group) % 2 == 0 and group[:size] == group[size:]:
                group = group[:size]
            kept += group
            index = end
        else:
            kept.append(calls[index])
            index += 1
    return kept


def assert_same_calls(expected: ProgramRun, got: ProgramRun, ignore: tuple[str, ...] = ()) -> None:
    """The same hooks (:func:`compared_calls`), with the same scalar arguments, in the same order; the
    message shows the first difference with the calls around it."""
    expected = ProgramRun(compared_calls(expected, ignore), expected.values, expected.results)
    got = ProgramRun(compared_calls(got, ignore), got.values, got.results)
    if expected.calls == got.calls:
        return
    first = next((i for i, (a, b) in enumerate(zip(expected.calls, got.calls)) if a != b),
                 min(len(expected.calls), len(got.calls)))
    window = slice(max(0, first - 5), first + 8)
    raise AssertionError(
        f"hook sequences differ at call {first} ({len(expected.calls)} calls expected, {len(got.calls)} got)\n"
        f"--- expected [{window.start}:]\n{format_calls(expected.calls[window])}"
        f"--- got [{window.start}:]\n{format_calls(got.calls[window])}"
    )


def assert_same_values(expected: ProgramRun, got: ProgramRun, rtol: float, extra_names: bool = False,
                       skip: tuple[str, ...] = ()) -> None:
    """The numbers taken at the value hooks: the same hooks, the same names, values equal to ``rtol``.

    ``extra_names``: ``got`` may hold names ``expected`` does not (this trainer's own reports, such as
    ``train/lr``, sit in ``callback_metrics`` beside the user's; every name Lightning has must be there
    with Lightning's value). ``skip``: name prefixes left out of both (values that differ by nature,
    such as step times)."""
    problems = []
    if [hook for hook, _ in expected.values] != [hook for hook, _ in got.values]:
        problems.append(f"value hooks differ: {[h for h, _ in expected.values]} != {[h for h, _ in got.values]}")
    # the n-th call of each hook against the n-th call of the same hook (so one missing call does not
    # shift every comparison after it)
    for hook in dict.fromkeys(h for h, _ in expected.values):
        ours = [values for h, values in got.values if h == hook]
        for index, (a, b) in enumerate(zip([values for h, values in expected.values if h == hook], ours)):
            a = {k: v for k, v in a.items() if not k.startswith(skip)}
            b = {k: v for k, v in b.items() if not k.startswith(skip)}
            if not set(a) <= set(b) or (set(a) != set(b) and not extra_names):
                problems.append(f"{hook} #{index}: names {sorted(a)} != {sorted(b)}")
            for name in sorted(set(a) & set(b)):
                if not close(a[name], b[name], rtol):
                    problems.append(f"{hook} #{index}: {name} {a[name]!r} != {b[name]!r}")
    if problems:
        raise AssertionError("\n".join(problems[:40]))


def assert_same_numbers(expected: ProgramRun, got: ProgramRun, rtol: float, atol: float = 1e-7,
                        skip: tuple[str, ...] = (), extra: tuple[str, ...] = ()) -> None:
    """The flattened results: the same paths, tensors equal to ``rtol`` / ``atol``, strings equal.
    ``skip``: path prefixes left out of both; ``extra``: path prefixes under which ``got`` may hold
    paths ``expected`` does not (``"fit/"``: this trainer's own reports in ``callback_metrics``)."""
    a = {k: v for k, v in expected.numbers.items() if not k.startswith(skip)}
    b = {k: v for k, v in got.numbers.items() if not k.startswith(skip)}
    problems = []
    missing, surplus = set(a) - set(b), {k for k in set(b) - set(a) if not k.startswith(extra)}
    if missing or surplus:
        problems.append(f"only expected: {sorted(missing)}; only got: {sorted(surplus)}")
    for key in sorted(set(a) & set(b)):
        x, y = a[key], b[key]
        if isinstance(x, str) or isinstance(y, str):
            if x != y:
                problems.append(f"{key}: {x!r} != {y!r}")
            continue
        if x.shape != y.shape:
            problems.append(f"{key}: shape {tuple(x.shape)} != {tuple(y.shape)}")
        elif not torch.allclose(x.double(), y.double(), rtol=rtol, atol=atol, equal_nan=True):
            difference = (x.double() - y.double()).abs().max().item()
            problems.append(f"{key}: differs by up to {difference:.3g}")
    if problems:
        raise AssertionError("\n".join(problems[:40]))
