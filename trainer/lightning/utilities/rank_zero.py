"""Lightning's rank-zero helpers: ``rank_zero_only`` (a decorator: the function runs on global rank 0
only), ``rank_zero_info`` / ``rank_zero_debug`` (logged by rank 0), ``rank_zero_warn`` /
``rank_zero_deprecation`` (a Python warning, on rank 0).

The rank is read when the function is called: the process group's rank during a run, else the
launcher's ``RANK`` variable (set in spawned workers and under torchrun), else 0. On several ranks, a
``rank_zero_only`` function that calls a model FSDP shards over several ranks raises at once, naming
itself: the model's forward would wait for ranks that never call it (trainer/strategies/fsdp_gathers.py).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import warnings
from typing import Any, Callable, Iterator

log = logging.getLogger("trainer.lightning")


def _global_rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", 0))


class _RankZeroOnly:
    """``@rank_zero_only`` or ``rank_zero_only(fn, default=value)``: ``fn`` runs on rank 0 only; other ranks
    get ``default`` (None). ``rank_zero_only.rank`` is this process's global rank."""

    @property
    def rank(self) -> int:
        return _global_rank()

    def __call__(self, fn: Callable[..., Any], default: Any = None) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            if _global_rank() != 0:
                return default
            if not _several_ranks():
                return fn(*args, **kwargs)
            with _no_gathers_in(fn):
                return fn(*args, **kwargs)

        return wrapped


def _several_ranks() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@contextlib.contextmanager
def _no_gathers_in(fn: Callable[..., Any]) -> Iterator[None]:
    """While ``fn`` runs on rank 0 alone, a call of a module whose parameters FSDP shards over several
    ranks raises at once: its forward would gather them from ranks that never make the call, and rank 0
    would wait for them until the collective timeout."""
    from torch.nn.modules.module import register_module_forward_pre_hook

    from trainer.strategies.fsdp_gathers import gathering_ranks

    def refuse(module: Any, args: Any) -> None:
        ranks = gathering_ranks(module)
        if ranks > 1:
            name = getattr(fn, "__qualname__", repr(fn))
            raise RuntimeError(
                f"{name} runs on rank 0 only (@rank_zero_only) and calls {type(module).__name__}, whose parameters "
                f"FSDP shards over {ranks} ranks: its forward gathers them from every rank, and the other ranks never "
                "make this call, so rank 0 would wait for them until trainer.collective_timeout_s. Call the model on "
                "every rank (keep only what rank 0 alone must do, such as saving a file, under @rank_zero_only), "
                "or use strategy='ddp' (each rank holds the whole model)")

    handle = register_module_forward_pre_hook(refuse)
    try:
        yield
    finally:
        handle.remove()


rank_zero_only = _RankZeroOnly()


def rank_zero_info(*args: Any, stacklevel: int = 4, **kwargs: Any) -> None:
    """``logging``'s ``info`` on rank 0 (logger "trainer.lightning")."""
    if _global_rank() == 0:
        log.info(*args, stacklevel=stacklevel, **kwargs)


def rank_zero_debug(*args: Any, stacklevel: int = 4, **kwargs: Any) -> None:
    """``logging``'s ``debug`` on rank 0 (logger "trainer.lightning")."""
    if _global_rank() == 0:
        log.debug(*args, stacklevel=stacklevel, **kwargs)


def rank_zero_warn(message: str | Warning, stacklevel: int = 4, **kwargs: Any) -> None:
    """``warnings.warn(message, ...)`` on rank 0."""
    if _global_rank() == 0:
        warnings.warn(message, stacklevel=stacklevel, **kwargs)


def rank_zero_deprecation(message: str | Warning, stacklevel: int = 5, **kwargs: Any) -> None:
    """A ``DeprecationWarning`` on rank 0."""
    kwargs.setdefault("category", DeprecationWarning)
    rank_zero_warn(message, stacklevel=stacklevel, **kwargs)


def share_rank_with_lightning_utilities() -> None:
    """Set ``lightning_utilities``' ``rank_zero_only.rank`` as importing Lightning does (when that
    library is installed and the rank is not set yet): programs written for Lightning use its
    rank-zero helpers directly (lightning-hydra-template's ``RankedLogger``), and they refuse to run
    until the rank is set."""
    try:
        from lightning_utilities.core.rank_zero import rank_zero_only as shared
    except ImportError:  # not installed: nothing to share the rank with
        return
    if getattr(shared, "rank", None) is None:
        shared.rank = _global_rank()
