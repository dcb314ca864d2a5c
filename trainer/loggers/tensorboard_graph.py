"""The model's graph in TensorBoard's GRAPHS tab (``TensorBoardLogger(log_graph=True)``).

The trainer asks for it once per call, on rank 0, after the hyperparameters: the module is traced
on rank 0 alone with its ``example_input_array`` (or the input given), so only a model whose
forward needs no other rank can be traced: under a strategy that shards the parameters (FSDP) or
splits the model (pipeline) the forward would wait for the other ranks, and the trainer skips the
graph with a warning that says so (trainer/loop/run_build.py).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

_NOT_GIVEN = ("Could not log computational graph to TensorBoard: The `model.example_input_array` attribute is "
              "not set or `input_array` was not given.")


def graph_input(model: Any, input_array: Any) -> Any:
    """The input to trace ``model`` with (``input_array``, else the model's ``example_input_array``)
    on the model's device, or None after a UserWarning saying why there is none."""
    if input_array is None:
        input_array = getattr(model, "example_input_array", None)
    if input_array is None:
        warnings.warn(_NOT_GIVEN, UserWarning, stacklevel=3)
        return None
    if not isinstance(input_array, (torch.Tensor, tuple)):
        warnings.warn(f"Could not log computational graph to TensorBoard: The `input_array` or "
                      f"`model.example_input_array` has type {type(input_array)} which can't be traced by "
                      "TensorBoard. Make the input array a tuple representing the positional arguments to the "
                      "model's `forward()` implementation.", UserWarning, stacklevel=3)
        return None
    device = next((tensor.device for tensor in model.parameters()), torch.device("cpu"))
    if isinstance(input_array, tuple):
        return tuple(item.to(device) if isinstance(item, torch.Tensor) else item for item in input_array)
    return input_array.to(device)


def add_graph(writer: Any, model: Any, example: Any) -> None:
    """Trace ``model`` on ``example`` into ``writer`` (a SummaryWriter), the model's training mode
    kept (the tracer switches it to eval and back). While it traces, a module's ``trainer`` is None
    when it has none (the tracer reads every attribute of the module)."""
    training = model.training
    model.__dict__["_graph_tracing"] = True
    try:
        with torch.no_grad():
            writer.add_graph(model, example)
    finally:
        model.__dict__.pop("_graph_tracing", None)
        model.train(training)


#: the strategies under which rank 0 can run the module's forward alone (the others shard or split it)
TRACEABLE_STRATEGIES = ("single", "ddp")


def log_graphs(loggers: list, module: Any, strategy_name: str) -> None:
    """Lightning's ``logger.log_graph(module)`` for each of rank 0's ``loggers`` once a call's loggers
    are open; under a strategy not in `TRACEABLE_STRATEGIES`, none, and a UserWarning when a logger
    asked for the graph (``log_graph=True``)."""
    if strategy_name in TRACEABLE_STRATEGIES:
        for logger in loggers:
            logger.log_graph(module)
    elif any(getattr(logger, "log_graph_enabled", False) for logger in loggers):
        warnings.warn(f"TensorBoardLogger(log_graph=True): the graph is not logged under strategy={strategy_name!r} "
                      "(tracing the forward on rank 0 alone would wait for the other ranks); it is logged under "
                      f"{' and '.join(TRACEABLE_STRATEGIES)}", UserWarning, stacklevel=2)
