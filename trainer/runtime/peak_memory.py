"""The peak tensor memory of a block of code, measured (never predicted): the batch-size finder's yardstick.

- CPU (``TensorMemoryPeak``): a ``TorchDispatchMode`` sees every aten op run inside the block and
  counts the bytes of each new storage an op returns, until that storage is freed (a
  ``weakref.finalize`` on it: torch keeps one Python object per storage alive while the storage is).
  Outputs that alias an input (views, in-place and ``out=`` ops) add nothing; tensors that exist
  before the block (parameters, optimizer state) count when passed as ``resident``. What is freed
  inside the block stops counting; the peak is the largest sum of live bytes at any op's end.
  Not seen: memory outside tensors (Python objects, the allocator's caching and fragmentation), and
  tensors allocated before the block that are not passed as ``resident`` (DDP's gradient buckets).
- CUDA (``cuda_peak``): ``torch.cuda.max_memory_allocated`` over the block, after
  ``reset_peak_memory_stats``: every tensor on the device, whoever allocated it.
"""

from __future__ import annotations

import weakref
from typing import Any, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def _storage(tensor: torch.Tensor) -> Any:
    """The storage holding ``tensor``'s data (a DTensor's: its local shard's); None for a tensor without one."""
    from torch.distributed.tensor import DTensor

    if isinstance(tensor, DTensor):
        tensor = tensor._local_tensor
    if tensor.device.type == "meta" or torch._C._functorch.is_functorch_wrapped_tensor(tensor):
        return None
    try:
        return tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):  # a tensor subclass without real storage
        return None


class TensorMemoryPeak(TorchDispatchMode):
    """``with TensorMemoryPeak(resident) as meter: ...``; then ``meter.peak`` (bytes) and
    ``meter.current`` (live bytes at the end). See the module docstring for what it counts."""

    def __init__(self, resident: Iterable[torch.Tensor] = ()):
        super().__init__()
        self._live: dict[int, int] = {}  # id(storage) -> bytes, while the storage lives
        self._finalizers: list[weakref.finalize] = []
        self.current = 0
        self.peak = 0
        for tensor in resident:
            self._track(_storage(tensor))
        self.peak = self.current

    def _track(self, storage: Any) -> None:
        if storage is None or id(storage) in self._live:
            return
        size = storage.nbytes()
        key = id(storage)
        self._live[key] = size
        self.current += size
        self._finalizers.append(weakref.finalize(storage, self._free, key))

    def _free(self, key: int) -> None:
        self.current -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        returns = func._schema.returns
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        for index, value in enumerate(outputs):
            aliases = index < len(returns) and returns[index].alias_info is not None
            if aliases:  # a view or an in-place / out= result: the memory of an input
                continue
            for leaf in tree_leaves(value):
                if isinstance(leaf, torch.Tensor):
                    self._track(_storage(leaf))
        self.peak = max(self.peak, self.current)
        return out

    def __exit__(self, *exc: Any) -> Any:
        result = super().__exit__(*exc)
        for finalizer in self._finalizers:  # storages still alive are no longer this meter's business
            finalizer.detach()
        self._finalizers.clear()
        return result


class CudaPeak:
    """``with CudaPeak(device) as meter: ...``; then ``meter.peak``: ``max_memory_allocated`` over the block."""

    def __init__(self, device: torch.device):
        self.device, self.peak = device, 0

    def __enter__(self) -> CudaPeak:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.cuda.synchronize(self.device)
        self.peak = torch.cuda.max_memory_allocated(self.device)
