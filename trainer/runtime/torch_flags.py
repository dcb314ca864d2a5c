"""Lightning's ``Trainer(deterministic=, benchmark=, detect_anomaly=)``: torch's global flags, set on every rank for
the duration of a call and restored afterwards (so one run's settings do not leak into the next,
or into the caller's process after an in-process run).

- ``deterministic=True``: ``torch.use_deterministic_algorithms(True)`` (an op without a
  deterministic implementation raises), and ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` unless set, which
  CUDA's deterministic matmuls need; ``"warn"``: the same with ``warn_only=True``; ``False``:
  ``use_deterministic_algorithms(False)``; None: left as it is.
- ``benchmark``: ``torch.backends.cudnn.benchmark``; None: left as it is, except False when
  ``deterministic`` is set (as Lightning: cuDNN's autotuner picks kernels by timing).
- ``detect_anomaly=True``: ``torch.autograd.set_detect_anomaly(True)`` (a backward that makes a NaN
  raises, naming the forward op; slow); False: left as it is.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

import torch

DETERMINISTIC_VALUES = (None, True, False, "warn")


@contextlib.contextmanager
def torch_flags(deterministic: Any, benchmark: bool | None, detect_anomaly: bool = False) -> Iterator[None]:
    """Set the flags for the body, then restore the previous ones."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.benchmark, os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    anomaly = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled())
    if benchmark is None and deterministic:
        benchmark = False
    try:
        if benchmark is not None:
            torch.backends.cudnn.benchmark = benchmark
        if deterministic is not None:
            torch.use_deterministic_algorithms(bool(deterministic), warn_only=deterministic == "warn")
        if deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        if detect_anomaly:
            torch.autograd.set_detect_anomaly(True)
        yield
    finally:
        torch.autograd.set_detect_anomaly(*anomaly)
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.benchmark = before[2]
        if before[3] is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = before[3]
