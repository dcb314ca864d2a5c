"""Speed metrics logged on logging steps: step time, samples/s and tokens/s (global), achieved
TFLOP/s per device and MFU, peak memory.

FLOPs are counted once, with PyTorch's FLOP counter, over one micro-batch's forward and backward
on the first step (every matmul / conv / attention the model really runs), then scaled to the
global batch. MFU divides the achieved FLOP/s by the device's peak from the table below (dense
tensor-core figures from the vendors' datasheets); on CPUs and unknown GPUs it is not logged.
"""

from __future__ import annotations

import os

import resource
import sys
import time
from typing import Any
import torch

#: Peak dense TFLOP/s by GPU name fragment: (16-bit tensor cores, fp32). Most specific first.
PEAK_TFLOPS: dict[str, tuple[float, float]] = {
    "H200": (989.4, 66.9),
    "H100 PCIe": (756.0, 51.2),
    "H100": (989.4, 66.9),
    "A100": (312.0, 19.5),
    "L40S": (362.1, 91.6),
    "L4": (121.0, 30.3),
    "A10G": (70.0, 31.2),
    "A10": (125.0, 31.2),
    "V100": (125.0, 15.7),
    "T4": (65.0, 8.1),
}


def _register_cpu_attention_flops() -> None:
    """PyTorch's FLOP counter knows the CUDA attention kernels but not the CPU one that
    ``scaled_dot_product_attention`` uses here; give it the same formula (full T x T matmuls, as
    the usual 6N + 12 L T d accounting does)."""
    from torch.utils import flop_counter

    aten = torch.ops.aten
    forward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    backward = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
    if forward is None or backward is None or forward in flop_counter.flop_registry:
        return

    @flop_counter.register_flop_formula(forward)
    def _forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)

    @flop_counter.register_flop_formula(backward)
    def _backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return flop_counter.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


_register_cpu_attention_flops()


def peak_tflops(device: torch.device, sixteen_bit: bool) -> float | None:
    """The device's peak dense TFLOP/s for the training dtype, or None if unknown (e.g. CPUs)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for fragment, (half, single) in PEAK_TFLOPS.items():
        if fragment in name:
            return half if sixteen_bit else single
    return None


def peak_memory_gb(device: torch.device) -> dict[str, float]:
    """Peak memory of this process: CUDA allocated / reserved, or the process's peak RSS on CPU."""
    if device.type == "cuda":
        return {
            "memory/peak_allocated_gb": torch.cuda.max_memory_allocated(device) / 1e9,
            "memory/peak_reserved_gb": torch.cuda.max_memory_reserved(device) / 1e9,
        }
    # ru_maxrss is in KiB on Linux, bytes on macOS.
    scale = 1 if sys.platform == "darwin" else 1024
    return {"memory/peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 1e9}


class Throughput:
    """Accumulates steps between logging steps and turns them into rates.

    Args:
        device: this rank's device (for the peak table and memory).
        world_size: processes in the job (MFU is per device).
        sixteen_bit: whether the matmuls run in bf16 / fp16 (selects the peak).
    """

    def __init__(self, device: torch.device, world_size: int, sixteen_bit: bool):
        self.device = device
        self.world_size = world_size
        self.peak = peak_tflops(device, sixteen_bit)
        self.flops_per_step: float | None = None  # global, fwd + bwd
        self._start = time.perf_counter()
        self._steps = 0
        self._samples = 0

    def set_flops_per_micro_batch(self, flops: int, micro_batches_per_step: int) -> None:
        """One rank's count for one micro-batch; every rank does the same work (data parallel)."""
        self.flops_per_step = float(flops) * micro_batches_per_step * self.world_size

    def set_flops_per_step(self, flops: float) -> None:
        """The whole job's count per step, when ranks do different work (pipeline stages)."""
        self.flops_per_step = float(flops)

    def step(self, global_samples: int) -> None:
        self._steps += 1
        self._samples += global_samples

    def metrics(self, global_tokens: float | None) -> dict[str, float]:
        """Rates since the last call (a logging step); resets the window."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # logging steps sync anyway (metrics .item())
        now = time.perf_counter()
        elapsed, steps = max(now - self._start, 1e-9), max(self._steps, 1)
        out = {
            "perf/step_time_s": elapsed / steps,
            "perf/samples_per_s": self._samples / elapsed,
        }
        if global_tokens is not None:
            out["perf/tokens_per_s"] = global_tokens / elapsed
        if self.flops_per_step is not None:
            achieved = self.flops_per_step * steps / elapsed / self.world_size / 1e12
            out["perf/tflops_per_device"] = achieved
            if self.peak is not None:
                out["perf/mfu"] = achieved / self.peak
        out.update(peak_memory_gb(self.device))
        self._start, self._steps, self._samples = now, 0, 0
        return out


class FlopSum:
    """Context that sums the FLOPs of the aten ops run inside it (PyTorch's formulas), without
    ``FlopCounterMode``'s per-module tracking: that tracking hooks the autograd graph, which
    ``torch.autograd.grad`` on stage inputs (the zero-bubble schedules' split backward) rejects."""

    def __init__(self) -> None:
        self.total = 0

    def __enter__(self) -> "FlopSum":
        from torch.utils import flop_counter
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                formula = flop_counter.flop_registry.get(func._overloadpacket)
                if formula is not None:
                    counter.total += formula(*args, **kwargs, out_val=out)
                return out

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)

    def get_total_flops(self) -> int:
        return self.total


def write_flops_by_module(counter: Any, path: str, depth: int = 3) -> None:
    """The FLOPs of one micro-batch's forward + backward per module (``FlopCounterMode`` counts),
    down to ``depth`` levels, as a text table."""
    rows = []
    for name, per_op in counter.get_flop_counts().items():
        name = name.replace("TrainingStepForward.module.", "", 1)  # the trainer's wrapper, not the user's model
        if name != "TrainingStepForward" and name.count(".") < depth:
            rows.append((name, sum(per_op.values())))
    total = counter.get_total_flops() or 1
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(f"{'module':60s} {'GFLOP':>12s} {'share':>7s}\n")
        for name, flops in rows:
            handle.write(f"{name:60s} {flops / 1e9:12.3f} {flops / total:7.1%}\n")
