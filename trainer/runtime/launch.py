"""Where the processes come from: torchrun, SLURM, the legacy/deepspeed launchers, or ourselves.

``detect_environment`` reads the variables a launcher sets. With no launcher and ``devices=N > 1``,
``spawn`` starts N workers itself: the launcher process hosts the rendezvous store, workers are
started from a warm fork server (``forkserver``: a clean process that imported torch and the trainer
once, and forks a worker per rank: a worker starts in milliseconds instead of the seconds an import of
torch and its compiler stack costs; the caller is never forked itself, whose thread pools do not
survive a fork), and the first worker to die ends the job with a message that names its rank.
Where ``forkserver`` does not exist (Windows) workers are started with ``spawn``.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import re
import signal
import sys
import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch.multiprocessing as mp

from trainer.runtime import heartbeat
from trainer.runtime.supervision import WorkerFailed, supervise

__all__ = ["ClusterEnvironment", "RankAgreedError", "WorkerFailed", "detect_environment", "spawn"]


#: launchers that start every rank themselves (this process then joins them instead of spawning)
EXTERNAL_LAUNCHERS = ("torchrun", "slurm", "submitit")


@dataclass(frozen=True)
class ClusterEnvironment:
    """This process's place in the job."""

    launcher: str  # "torchrun" (also torch.distributed.launch and deepspeed), "slurm", "submitit", "spawned", "none"
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0

    @property
    def external(self) -> bool:
        """True when another program started every rank (so this process must not spawn)."""
        return self.launcher in EXTERNAL_LAUNCHERS

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def strip_local_rank_argument(argv: list[str]) -> list[str]:
    """Remove ``--local_rank=N`` / ``--local-rank N`` (passed by ``python -m torch.distributed.launch``
    without --use-env and by the deepspeed launcher) so Hydra does not reject it, and export it as
    LOCAL_RANK."""
    kept: list[str] = []
    i = 0
    while i < len(argv):
        match = re.fullmatch(r"--local[_-]rank(?:=(\d+))?", argv[i])
        if match is None:
            kept.append(argv[i])
            i += 1
            continue
        value = match.group(1)
        if value is None and i + 1 < len(argv):
            value = argv[i + 1]
            i += 1
        i += 1
        if value is not None:
            os.environ.setdefault("LOCAL_RANK", value)
    return kept


def expand_slurm_nodelist(nodelist: str) -> list[str]:
    """``node[01-03,07],gpu5`` -> ``[node01, node02, node03, node07, gpu5]``."""
    hosts: list[str] = []
    for match in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist):
        prefix, ranges = match.group(1), match.group(2)
        if ranges is None:
            hosts.append(prefix)
            continue
        for part in ranges.split(","):
            start, _, end = part.partition("-")
            for number in range(int(start), int(end or start) + 1):
                hosts.append(f"{prefix}{number:0{len(start)}d}")
    return hosts


def detect_environment(environ: dict[str, str] | None = None) -> ClusterEnvironment:
    """Read the launcher's variables (torchrun first, then SLURM); ``none`` when there are none."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        world_size = int(env["WORLD_SIZE"])
        local_world_size = int(env.get("LOCAL_WORLD_SIZE", world_size))
        rank = int(env["RANK"])
        return ClusterEnvironment(
            launcher="spawned" if env.get("TRAINER_SPAWNED") == "1" else "torchrun",
            rank=rank,
            local_rank=int(env.get("LOCAL_RANK", rank % local_world_size)),
            world_size=world_size,
            local_world_size=local_world_size,
            node_rank=int(env.get("GROUP_RANK", rank // local_world_size)),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", 29500)),
        )
    # srun sets SLURM_PROCID per task; one task per node with devices > 1 means we spawn instead.
    if "SLURM_PROCID" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
        world_size = int(env["SLURM_NTASKS"])
        nodes = int(env.get("SLURM_NNODES", "1"))
        hosts = expand_slurm_nodelist(env.get("SLURM_JOB_NODELIST", env.get("SLURM_NODELIST", "127.0.0.1")))
        return ClusterEnvironment(
            launcher="slurm",
            rank=int(env["SLURM_PROCID"]),
            local_rank=int(env.get("SLURM_LOCALID", "0")),
            world_size=world_size,
            local_world_size=world_size // max(nodes, 1),
            node_rank=int(env.get("SLURM_NODEID", "0")),
            master_addr=env.get("MASTER_ADDR", hosts[0] if hosts else "127.0.0.1"),
            # Every task derives the same port from the job id, so no extra rendezvous is needed.
            master_port=int(env.get("MASTER_PORT", 15000 + int(env.get("SLURM_JOB_ID", "0")) % 20000)),
        )
    # submitit's local executor (hydra/launcher=submitit_local with tasks_per_node > 1) starts the tasks of a
    # job on this machine with variables of its own (on SLURM, submitit's tasks carry SLURM's, read above).
    if "SUBMITIT_LOCAL_GLOBALID" in env and int(env.get("SUBMITIT_LOCAL_NTASKS", "1")) > 1:
        world_size = int(env["SUBMITIT_LOCAL_NTASKS"])
        return ClusterEnvironment(
            launcher="submitit",
            rank=int(env["SUBMITIT_LOCAL_GLOBALID"]),
            local_rank=int(env.get("SUBMITIT_LOCAL_LOCALID", env["SUBMITIT_LOCAL_GLOBALID"])),
            world_size=world_size,
            local_world_size=world_size,
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", 15000 + int(env.get("SUBMITIT_LOCAL_JOB_ID", "0")) % 20000)),
        )
    return ClusterEnvironment(launcher="none")


class RankAgreedError(RuntimeError):
    """An error every rank raises alike (a damaged checkpoint): a spawned fit's caller gets it as it
    is, one message instead of a worker's traceback."""


def share_cpu_threads(local_world_size: int) -> None:
    """Give each of this machine's ``local_world_size`` workers its share of the CPU cores for torch's
    intra-op threads (as torchrun, which sets ``OMP_NUM_THREADS=1``, and Lightning do), unless the user
    chose with ``OMP_NUM_THREADS``. Without it every worker starts one thread per core: N workers on N
    cores run N x N spinning threads, and a 2-rank CPU step took 10x longer on a 2-core machine."""
    if "OMP_NUM_THREADS" in os.environ or local_world_size <= 1:
        return
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world_size))


#: signals meant for the job, which the fork server ignores (trainer/runtime/fork_server.py)
JOB_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGUSR1", "SIGHUP") if hasattr(signal, name))

#: what the fork server imports once, before it forks any worker: torch, the modules DDP and FSDP
#: import on first use (torch._dynamo alone is ~2 s per process here), and the trainer's loop.
FORK_SERVER_PRELOAD = ["trainer.runtime.fork_server", "torch", "torch.distributed", "torch._dynamo", "trainer.loop.entry"]


def _start_method() -> str:
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def _fork_server_pid(start_method: str) -> int | None:
    """The pid of multiprocessing's fork server, which forks the workers (None under ``spawn``, or
    where multiprocessing keeps it elsewhere): the launcher names it if it dies (supervision.py)."""
    if start_method != "forkserver":
        return None
    from multiprocessing import forkserver

    pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)
    return pid if isinstance(pid, int) else None


def _adopt_caller_environment(environ: dict[str, str]) -> None:
    """A worker forked by the fork server inherits the server's environment (as it was when the
    server started), not the caller's: take the caller's, as a spawned process would."""
    os.environ.clear()
    os.environ.update(environ)
    threads = environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:  # the OpenMP runtime read the server's value at load
        import torch

        torch.set_num_threads(int(threads))


def _spawned_entry(local_rank: int, payload: bytes, world_size: int, master_port: int, results: Any,
                   failures: Any = None, environ: dict[str, str] | None = None, silence_s: float | None = None) -> None:
    if environ is not None:  # forked by the fork server: its signal dispositions and environment are not ours
        for number in JOB_SIGNALS:
            signal.signal(number, signal.SIG_DFL)
        _adopt_caller_environment(environ)
        # multiprocessing made "forkserver" this worker's default start method too; its own children
        # (data-loader workers) start with the platform's default, as in a rank torchrun started,
        # never from a per-rank fork server that a killed rank would leave behind.
        import multiprocessing

        multiprocessing.set_start_method(None, force=True)
    os.environ.update(
        RANK=str(local_rank),
        LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(master_port),
        TRAINER_SPAWNED="1",
    )
    share_cpu_threads(world_size)
    # A rank that dies in native code (a segfault, an abort in a collective's thread) prints every
    # thread's Python stack on its stderr: the launcher then names it, and the stack says where.
    faulthandler.enable(all_threads=True)
    if silence_s is not None:  # beat for the launcher, which watches (trainer/runtime/supervision.py)
        heartbeat.start(lambda: _store_client(master_port, silence_s), local_rank, world_size, silence_s, watch=False)
    fn, args = pickle.loads(payload)
    try:
        result = fn(*args)
    except RankAgreedError as error:  # every rank stops with the same error (a damaged checkpoint):
        result = error  # the launcher raises it as it is, one message instead of a worker's traceback
    except Exception as error:
        # Reported by the launcher, once, with its rank: the first rank to fail is the cause, the
        # others usually fail because it left (a collective with a dead peer).
        if failures is not None:
            import time
            import traceback

            failures.put((time.time(), local_rank, os.getpid(), traceback.format_exc(),
                          " | ".join(f"{type(error).__name__}: {error}".splitlines())))
        raise
    if local_rank == 0:
        results.put(result)
    # What the run built is reachable from here (the Trainer in ``args``: its DDP wrapper; a
    # CheckpointError's traceback): drop it, so the process group goes before the interpreter ends.
    del fn, args, result
    heartbeat.stop()
    from trainer.runtime import distributed

    distributed.release_before_exit()


def _store_client(port: int, silence_s: float) -> Any:
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=silence_s))


FORWARDED_SIGNALS = ("SIGTERM", "SIGUSR1")


def _forward_signals(pids: list[int]) -> dict[int, Any]:
    """Install handlers that pass SIGTERM / SIGUSR1 on to ``pids``; returns the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def forward(signum: int, frame: Any) -> None:
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    previous = {}
    for name in FORWARDED_SIGNALS:
        number = getattr(signal, name, None)
        if number is not None:
            previous[number] = signal.signal(number, forward)
    return previous


def _restore_signals(previous: dict[int, Any]) -> None:
    for number, handler in previous.items():
        signal.signal(number, handler)


def _refuse_unimportable_main(payload: bytes, nprocs: int) -> None:
    """Spawned workers rebuild classes defined in ``__main__`` by running the main script again: from
    stdin, ``python -c`` or an interactive session there is no script, and each worker would die with
    a FileNotFoundError deep in multiprocessing. Say so before any worker starts."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if b"__main__" in payload and not (path and os.path.isfile(path)):
        raise RuntimeError(
            f"devices={nprocs} starts {nprocs} worker processes, which import the classes passed to the Trainer; "
            "some are defined in __main__, and this program has no script file to import them from (stdin, "
            "python -c, a notebook or an interactive session). Put the module (and callbacks) in a .py file and "
            "import it, or run a script (python my_script.py, torchrun my_script.py)"
        )


def spawn(fn: Callable[..., Any], args: tuple, nprocs: int, timeout: timedelta) -> Any:
    """Run ``fn(*args)`` in ``nprocs`` new processes on this machine and return rank 0's result.

    The launcher hosts the TCPStore the workers rendezvous on (port chosen by the OS, so parallel
    jobs never collide). If a worker dies, the others are terminated and ``WorkerFailed`` names it;
    so it does if a worker stops responding (no heartbeat for ``timeout``), and every worker is killed.
    """
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, world_size=None, is_master=True, timeout=timeout, wait_for_workers=False)
    # Plain pickle, not multiprocessing's: torch's multiprocessing pickler would move every tensor
    # (the module's weights) into shared memory, and all ranks would then update one copy.
    payload = pickle.dumps((fn, args))
    _refuse_unimportable_main(payload, nprocs)
    start_method = _start_method()
    context = mp.get_context(start_method)
    if start_method == "forkserver":
        context.set_forkserver_preload(FORK_SERVER_PRELOAD)  # (read once, when the server starts)
    results = context.SimpleQueue()
    failures = context.SimpleQueue()
    processes = mp.start_processes(
        _spawned_entry,
        args=(payload, nprocs, store.port, results, failures, dict(os.environ), timeout.total_seconds()),
        nprocs=nprocs,
        join=False,
        start_method=start_method,
    )
    # Preemption signals sent to the launcher reach the workers, which save and stop cleanly.
    forwarded = _forward_signals([process.pid for process in processes.processes])
    try:
        supervise(processes, failures, store, timeout.total_seconds(), fork_server=_fork_server_pid(start_method))
    finally:
        _restore_signals(forwarded)
        del store
    result = None if results.empty() else results.get()
    if isinstance(result, Exception):
        raise result
    return result
