"""Process-group setup and the few collectives the trainer itself makes, each with a timeout.

Object collectives (run directory, config, metric-key checks) go over a dedicated gloo group,
so they work whatever the default backend is (NCCL tensors must live on the GPU).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import types
import weakref
import zlib
from datetime import timedelta
from typing import Any, Iterator

import torch
import torch.distributed as dist

# Imported before any process group exists, on purpose. DDP's constructor imports
# torch.distributed._shard, which imports this module, whose collectives take ``group=group.WORLD``
# as a default argument: imported after init_process_group, ten function defaults keep the default
# group alive after destroy_process_group, so its gloo worker threads are never joined. At the end
# of a run such a thread can still be releasing a finished collective's tensor while the interpreter
# finalizes; CPython ends it with pthread_exit inside gloo: "terminate called without an active
# exception", SIGABRT (pybind/pybind11#2215, pytorch/pytorch#38228). Imported now, the defaults are
# None, which those functions read as the default group at call time: same meaning, no reference.
import torch.distributed.nn.functional  # noqa: F401,E402

from trainer.runtime import heartbeat
from trainer.runtime.launch import ClusterEnvironment

_control_group: Any = None
_timeout = timedelta(minutes=30)
#: the cluster environment of the last ``init_process_group`` (its local rank: plain ``srun`` sets no LOCAL_RANK)
_environment: ClusterEnvironment | None = None
#: the process groups ``destroy_process_group`` destroyed (see ``destroyed_groups_alive``)
_destroyed: list[weakref.ref] = []


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def local_rank() -> int:
    """This process's rank on its node: the cluster environment's once the process group is set up
    (``SLURM_LOCALID`` under ``srun``), else ``LOCAL_RANK`` (0 when unset); 0 in one process
    (whatever a stray ``LOCAL_RANK`` says)."""
    if not is_distributed():
        return 0
    if _environment is not None and _environment.launcher != "none" and is_distributed():
        return _environment.local_rank
    return int(os.environ.get("LOCAL_RANK", 0))


def default_backend(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_process_group(env: ClusterEnvironment, backend: str, timeout: timedelta) -> bool:
    """Join the job's process group. Returns False when there was nothing to do: alone, or already
    joined (then only the timeout is updated, e.g. by ``train.py`` under torchrun)."""
    global _control_group, _timeout, _environment
    _timeout = timeout
    _environment = env
    if is_distributed():
        dist.distributed_c10d._set_pg_timeout(timeout, dist.group.WORLD)
        heartbeat.set_silence(timeout.total_seconds())
        return False
    if not env.distributed:
        return False
    if env.launcher == "spawned":
        # The launcher hosts the store; every worker is a client of it.
        store = dist.TCPStore(env.master_addr, env.master_port, is_master=False, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=env.rank, world_size=env.world_size, timeout=timeout)
    elif env.launcher == "torchrun" and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun's agent hosts the store at MASTER_ADDR/PORT and keeps it across restarts
        # (--max-restarts): keys of a restarted attempt get their own prefix, or its ranks would
        # read the dead attempt's addresses and fail to connect (or hang).
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        client = dist.TCPStore(env.master_addr, env.master_port, is_master=False, timeout=timeout)
        store = dist.PrefixStore(f"trainer/attempt_{attempt}", client)
        dist.init_process_group(backend, store=store, rank=env.rank, world_size=env.world_size, timeout=timeout)
    else:
        # Under SLURM (or a launcher without an agent store) rank 0 hosts the store at the address
        # derived from the job; env:// joins it.
        init_method = "env://" if env.launcher == "torchrun" else f"tcp://{env.master_addr}:{env.master_port}"
        dist.init_process_group(
            backend, init_method=init_method, rank=env.rank, world_size=env.world_size, timeout=timeout
        )
    _control_group = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else dist.group.WORLD
    if env.external:  # (spawned workers beat for their launcher from the start)
        _start_heartbeat(env, timeout)
    return True


def _start_heartbeat(env: ClusterEnvironment, timeout: timedelta) -> None:
    """Beat, and watch the next rank's beat, through the job's store (trainer/runtime/heartbeat.py):
    torchrun's agent store (under this attempt's prefix) or the one rank 0 hosts."""
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    address = f"{env.master_addr}:{env.master_port}"

    def connect() -> Any:
        client = dist.TCPStore(env.master_addr, env.master_port, is_master=False, timeout=timeout)
        return dist.PrefixStore(f"trainer/attempt_{attempt}", client) if agent_store else client

    name = f"torchrun's store at {address}" if agent_store else f"the job's store at {address} (on rank 0)"
    heartbeat.start(connect, env.rank, env.world_size, timeout.total_seconds(), watch=True, store_name=name)


def init_single_process_group(backend: str, timeout: timedelta) -> None:
    """A process group of one (in-memory store), for code that needs one even when alone (FSDP)."""
    global _control_group, _timeout
    _timeout = timeout
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    _control_group = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else dist.group.WORLD


def destroy_process_group(clean: bool = True) -> None:
    """Leave the process group; ``clean=False`` after an error, when peers may never arrive."""
    global _control_group, _environment
    if is_distributed():
        if clean:
            # Leave together: a rank that tears down while a peer still talks to it aborts in gloo.
            barrier()
        if not (_environment is not None and _environment.launcher == "spawned"):
            heartbeat.stop(failed=not clean)  # (a spawned worker beats until its process ends)
        # Every group, not only the default one: a pipeline's or a hybrid mesh's subgroups have gloo
        # threads of their own. (torch lists them only in its private registry; diagnostics only.)
        registry = getattr(getattr(dist.distributed_c10d, "_world", None), "pg_map", {})
        _destroyed.extend(weakref.ref(group) for group in {dist.group.WORLD, *registry})
        _clear_dtensor_caches()
        _clear_group_defaults()
        dist.destroy_process_group()
    _control_group = _environment = None


def _clear_dtensor_caches() -> None:
    """DTensor (FSDP's parameters are DTensors) memoizes, in process-wide caches, values that hold a
    DeviceMesh, and through it the mesh's process groups: the sharding propagation caches (torch
    names ``debug._clear_sharding_prop_cache`` the way to clear them), the redistribute planners
    (``clear_redistribute_planner_cache``) and two ``functools`` caches (``_gen_transform_infos``'
    docstring says to clear it with ``cache_clear``). Without this the
    group outlives ``destroy_process_group`` and its gloo threads run on into the interpreter's
    finalization. Megatron-LM clears these caches at teardown too (NVIDIA/Megatron-LM#7029). Each
    is looked up, not assumed: if a later torch moves one, ``destroyed_groups_alive`` says so."""
    if "torch.distributed.tensor" not in sys.modules:
        return  # nothing used DTensors
    from torch.distributed.tensor import _collective_utils, _redistribute, debug

    for clear in (getattr(debug, "_clear_sharding_prop_cache", None),
                  getattr(_redistribute, "clear_redistribute_planner_cache", None)):
        if clear is not None:
            clear()
    for cached in (getattr(getattr(_collective_utils, "MeshTopoInfo", None), "build_from_mesh", None),
                   getattr(_redistribute, "_gen_transform_infos", None)):
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()
    _clear_module_caches("torch.distributed.tensor")


def _clear_module_caches(package: str) -> None:
    """Clear every ``functools`` cache of the loaded modules of ``package``: module-level, on a class
    (``ShardingPropagator._propagate_tensor_meta_cached``, an ``lru_cache`` on a method whose keys are
    op schemas, hence DTensor specs and their meshes: tensor parallel's ops fill it) or one a function
    closes over. The ones named above, and any a later torch adds."""
    for name, module in list(sys.modules.items()):
        if module is None or not (name == package or name.startswith(package + ".")):
            continue
        for value in list(vars(module).values()):
            members = list(vars(value).values()) if isinstance(value, type) else [value]
            for member in members:
                if hasattr(member, "cache_clear"):
                    member.cache_clear()
                cells = getattr(member, "__closure__", None) if type(member) is types.FunctionType else None
                for cell in cells or ():
                    try:
                        inner = cell.cell_contents
                    except ValueError:  # an empty cell
                        continue
                    if hasattr(inner, "cache_clear"):
                        inner.cache_clear()


def _clear_group_defaults() -> None:
    """A ``torch.distributed`` module imported after ``init_process_group`` binds the live default
    group into every ``group=group.WORLD`` default argument (as the import of
    ``torch.distributed.nn.functional`` above explains). ZeRO-1's optimizer module is one, and is
    imported only when a run asks for ZeRO-1 (importing it up front costs 0.6 s a process): its
    ``_broadcast_object`` would keep the destroyed group, and its gloo threads, alive to the
    interpreter's end. Such defaults are reset to None, which torch reads as the default group at
    call time: the same meaning without the reference. A scan of the loaded ``torch.distributed``
    modules' functions (a few milliseconds), so a later torch's new one is covered too."""
    for name, module in list(sys.modules.items()):
        if not name.startswith("torch.distributed") or module is None:
            continue
        for function in list(vars(module).values()):
            # type(), not isinstance(): the latter reads ``__class__``, which a deprecated name warns on
            defaults = function.__defaults__ if type(function) is types.FunctionType else None
            if defaults and any(isinstance(value, dist.ProcessGroup) for value in defaults):
                function.__defaults__ = tuple(None if isinstance(value, dist.ProcessGroup) else value
                                              for value in defaults)


def destroyed_groups_alive() -> int:
    """How many process groups that ``destroy_process_group`` destroyed are still referenced
    from Python (after freeing reference cycles). Each one keeps its gloo worker threads running
    until the interpreter finalizes, where they can abort the process (see the import of
    ``torch.distributed.nn.functional`` above); 0 once a run's objects are gone."""
    _destroyed[:] = [ref for ref in _destroyed if ref() is not None]
    # A full collection costs 0.1-1 s with torch loaded: only when something is left. Another one
    # while the last found garbage: objects a collection finalizes (with ``__del__``) are freed only
    # by the next one, and what they held (tensor-parallel parameters' meshes, their groups) with them.
    for _ in range(3):
        if not _destroyed or not gc.collect():
            break
        _destroyed[:] = [ref for ref in _destroyed if ref() is not None]
    return len(_destroyed)


def release_before_exit() -> None:
    """Called last by a rank that is about to end (``train.py`` under a launcher, spawned workers):
    free the run's reference cycles, so the destroyed process group goes and its gloo threads are
    joined before the interpreter finalizes; say so on stderr if something still holds it. Then
    spare the interpreter's final garbage collections the objects still alive (``gc.freeze``)."""
    alive = destroyed_groups_alive()
    if alive:
        print(f"warning: {alive} destroyed process group(s) still referenced as this rank ends; their gloo "
              "threads may abort the interpreter's exit", file=sys.stderr)
    # The interpreter's last collections would walk every object torch's modules made (about 0.5 s
    # of CPU per process here, a third of the exit): what is alive now is left to be freed
    # by reference counting and the process's end. Objects freed so far are not affected.
    gc.freeze()


def barrier() -> None:
    """Wait for every rank; on gloo a rank that does not arrive within the timeout is named."""
    if not is_distributed():
        return
    dist.monitored_barrier(group=_control_group, timeout=_timeout, wait_all_ranks=True)


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s ``obj`` on every rank."""
    if not is_distributed():
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=src, group=_control_group)
    return holder[0]


def all_gather_object(obj: Any) -> list[Any]:
    if not is_distributed():
        return [obj]
    gathered: list[Any] = [None] * world_size()
    dist.all_gather_object(gathered, obj, group=_control_group)
    return gathered


def any_rank(flag: bool) -> bool:
    """True on every rank if ``flag`` is True on any rank (one small all-reduce on the CPU group)."""
    if not is_distributed():
        return flag
    tensor = torch.tensor([int(flag)], dtype=torch.int32)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=_control_group)
    return bool(tensor.item())


def any_rank_and_values(flag: bool, value: int) -> tuple[bool, list[int]]:
    """`any_rank` that also gathers one int >= 0 from every rank (``values[r]``: rank r's), in
    the same single all-reduce: each rank fills its own slot of a zero vector, reduced by max."""
    if not is_distributed():
        return flag, [value]
    tensor = torch.zeros(1 + world_size(), dtype=torch.int64)
    tensor[0], tensor[1 + rank()] = int(flag), value
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=_control_group)
    return bool(tensor[0].item()), tensor[1:].tolist()


@contextlib.contextmanager
def rank_zero_first(local: bool = False) -> Iterator[bool]:
    """Run the body on rank 0 first (or local rank 0 of each node with ``local=True``), then on
    the others: the barrier pattern for downloads and caches. Yields whether this rank went first.
    The local rank is the cluster environment's (``SLURM_LOCALID`` under ``srun``, which sets no
    ``LOCAL_RANK``), as recorded when the process group was set up; before that, ``LOCAL_RANK``.

    >>> with rank_zero_first(local=True) as first:
    ...     dataset = load_or_build_cache(path)     # built once, then read by the rest
    """
    if not local:
        first = rank() == 0
    elif _environment is not None and _environment.launcher != "none":
        first = _environment.local_rank == 0
    else:
        first = int(os.environ.get("LOCAL_RANK", rank())) == 0
    if not first:
        barrier()
    try:
        yield first
    finally:
        if first:
            barrier()


class MetricKeyMismatch(RuntimeError):
    """Ranks reported different metric names; reducing them would hang or mix values."""


def check_same_keys(keys: list[str], what: str) -> None:
    """Cheap check that every rank reduces the same metric names in the same order: one all-gather
    of a checksum, and only on a mismatch a gather of the names for the error message."""
    if not is_distributed():
        return
    checksum = torch.tensor([zlib.crc32("\0".join(keys).encode())], dtype=torch.int64)
    gathered = [torch.zeros_like(checksum) for _ in range(world_size())]
    dist.all_gather(gathered, checksum, group=_control_group)
    if all(int(g) == int(checksum) for g in gathered):
        return
    per_rank = all_gather_object(keys)
    lines = "; ".join(f"rank {r}: {sorted(k)}" for r, k in enumerate(per_rank))
    raise MetricKeyMismatch(f"ranks logged different {what} metric keys ({lines}); every rank must return the same keys")


def gather_object(obj: Any) -> list[Any] | None:
    """Every rank's ``obj``, in rank order, on rank 0 (None on the other ranks)."""
    if not is_distributed():
        return [obj]
    gathered: list[Any] | None = [None] * world_size() if rank() == 0 else None
    dist.gather_object(obj, gathered, dst=0, group=_control_group)
    return gathered
