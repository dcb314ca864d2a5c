"""A server of warm ``trainer`` / ``python FILE`` commands for the docs test (tests/support/warm_commands.py
says how it is used): ``python tests/support/warm_command_server.py SOCKET`` imports torch, its compiler
stack, Hydra and the trainer's command line once, starts the fork server the trainer's ``spawn`` forks
its ranks from, and then serves each command in a process forked from itself.

A command arrives from ``warm_command_client.py`` as its arguments, working directory, environment and
its stdin / stdout / stderr (the descriptors themselves). Per command the server forks a relay, which
forks the command's process and reports its exit status; the command's process is what a fresh
interpreter running the command would be (its environment, directory, ``sys.argv``, ``sys.path``, its
``__main__``), minus the seconds of imports, in a session of its own. The relay kills that session
when the client goes away (a timed-out block killed with its process group).

Run as a script (never imported as ``tests.support...``): the commands' processes hold no module of
the test suite, so a project's own ``tests`` package imports as it would elsewhere.
"""

import json
import multiprocessing
import multiprocessing.forkserver
import os
import runpy
import signal
import socket
import sys
import threading

#: the imports that warm the server: what ``python -m trainer`` and a training run import
WARM_IMPORTS = ("hydra", "omegaconf", "trainer.cli.command", "trainer.cli.train", "trainer.cli.hydra_app")


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    header, fds, _, _ = socket.recv_fds(conn, 8, 3)
    size, data = int.from_bytes(header, "big"), b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError("the client went away")
        data += chunk
    return json.loads(data), fds


def _sibling_fork_server() -> None:
    """The command runs in a sibling of the server's fork server, not its parent: multiprocessing's
    liveness check (``os.waitpid``) works only in the parent; check it with signal 0 instead."""
    server = multiprocessing.forkserver._forkserver
    original = server.ensure_running

    def ensure_running() -> None:
        pid = server._forkserver_pid
        if pid is not None:
            try:
                os.kill(pid, 0)
                from multiprocessing import resource_tracker

                resource_tracker.ensure_running()
                return
            except ProcessLookupError:
                server._forkserver_pid = None  # gone: start one of this process's own
        original()

    server.ensure_running = ensure_running


def _python_path(command: dict, first: str) -> list[str]:
    """``sys.path`` as a fresh interpreter in that environment would have it: the script's folder (or
    the working directory), the entries of PYTHONPATH, then the server's interpreter paths."""
    server_extra = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    own = [os.path.abspath(os.path.join(command["cwd"], p))
           for p in command["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    rest = [p for p in sys.path[1:] if p not in server_extra]
    return [first, *own, *rest]


def _run_command(command: dict, fds: list[int], import_output: str) -> None:
    """In the command's process: become the fresh interpreter the command would have started, run it, exit.
    ``import_output`` (what the server's imports printed: a warning at import) is printed first, as the
    command's own imports would have."""
    os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(command["cwd"])
    os.environ.clear()
    os.environ.update(command["env"])
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = sys.__stdin__ = open(0, "r", closefd=False)
    sys.stdout = sys.__stdout__ = open(1, "w", buffering=1 if unbuffered or os.isatty(1) else -1, closefd=False)
    sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False)
    sys.stderr.write(import_output)
    if command.get("fork_server") == "own":  # its ranks from a fork server of its own, in its session
        multiprocessing.forkserver._forkserver._forkserver_pid = None
        multiprocessing.forkserver._forkserver._forkserver_address = None
        multiprocessing.forkserver._forkserver._forkserver_alive_fd = None
    else:
        _sibling_fork_server()
    args = command["args"]
    if command["mode"] == "module":  # python -m MODULE ARGS (the trainer command is python -m trainer)
        sys.path[:] = _python_path(command, os.getcwd())
        sys.argv = [args[0], *args[1:]]
        runpy.run_module(args[0], run_name="__main__", alter_sys=True)
    else:  # python FILE ARGS
        path = os.path.abspath(args[0])
        sys.path[:] = _python_path(command, os.path.dirname(path))
        sys.argv = list(args)
        runpy.run_path(path, run_name="__main__")


def _relay(conn: socket.socket) -> tuple[dict, list[int]]:
    """Between the server and one command: fork the command, tell the client its pid, kill its session
    if the client goes away, and send the client its wait status. Returns the command in the command's
    process (which runs it at the top level and exits as an interpreter does), never in the relay."""
    command, fds = _receive(conn)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    pid = os.fork()
    if pid == 0:
        conn.close()
        return command, fds
    for fd in fds:
        os.close(fd)
    conn.sendall(f"{pid}\n".encode())

    finished = threading.Event()

    def watch() -> None:  # the client gone while the command runs (a timeout killed it): end the command
        try:
            while conn.recv(64):
                pass
        except OSError:
            pass
        if not finished.is_set():
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    threading.Thread(target=watch, daemon=True).start()
    _, status = os.waitpid(pid, 0)
    finished.set()  # what it left running stays, as a fresh process's would
    try:
        conn.sendall(f"{status}\n".encode())
    except OSError:
        pass
    os._exit(0)


def serve(path: str) -> tuple[dict, list[int], str] | None:
    """Serve commands on the socket ``path`` until the parent (the test session) ends; returns, in a
    command's process only, the command to run and what the imports printed (stderr is a file)."""
    for name in WARM_IMPORTS:
        __import__(name)
    sys.stderr.flush()
    sys.stdout.flush()
    with open(f"/proc/self/fd/2", errors="replace") as printed:
        import_output = printed.read()
    from trainer.runtime.launch import FORK_SERVER_PRELOAD

    # The fork server the trainer's spawn would start in each command: started once, here.
    multiprocessing.set_forkserver_preload(FORK_SERVER_PRELOAD)
    multiprocessing.forkserver.ensure_running()
    parent = os.getppid()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # relays are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    os.rename(path + ".tmp", path)  # clients see the socket only once it accepts
    listener.listen(16)
    listener.settimeout(2.0)
    while os.getppid() == parent:  # the test session (the parent) ended: so does the server
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            continue
        conn.settimeout(None)
        if os.fork() == 0:
            listener.close()
            try:
                job = _relay(conn)
            except BaseException:
                os._exit(1)
            return (*job, import_output)
        conn.close()
    return None


if __name__ == "__main__":
    job = serve(sys.argv[1])
    if job is not None:
        _run_command(*job)  # exceptions, sys.exit and the exit itself as in a fresh interpreter
