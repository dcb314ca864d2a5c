"""The command side of tests/support/warm_command_server.py: ``python -S -E warm_command_client.py SOCKET
PYTHON [ARGS ...]`` does what ``PYTHON ARGS`` would, in a process forked from the warm server.

It runs there ``-m MODULE ...`` and ``FILE ...`` (the forms the docs' commands use); any other form (``-c``,
interpreter flags, ``-m pytest``, whose ``tests`` package would meet the server's), or no server
listening, is run by ``PYTHON`` itself. It passes the server its own stdin, stdout and stderr, its
working directory and environment; forwards the signals a shell or a test sends (SIGTERM, SIGINT,
SIGUSR1, SIGUSR2, SIGHUP) to the command's process; and exits as that process did (its status, or the
signal that ended it). Only the standard library: it starts in milliseconds (``-S -E``).
"""

import json
import os
import signal
import socket
import sys

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
COLD_MODULES = ("pytest",)


def _warm_form(args: list[str]) -> dict | None:
    if len(args) >= 2 and args[0] == "-m" and args[1] not in COLD_MODULES:
        return {"mode": "module", "args": args[1:]}
    if args and not args[0].startswith("-") and os.path.isfile(args[0]):
        return {"mode": "file", "args": args}
    return None


def _read_line(conn: socket.socket) -> str | None:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(64)
        if not chunk:
            return None
        data += chunk
    return data.decode().strip()


def main(socket_path: str, python: str, args: list[str]) -> None:
    command = _warm_form(args)
    if command is not None:
        command["fork_server"] = os.environ.get("WARM_COMMAND_FORK_SERVER", "shared")
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        if command is None:
            raise OSError("not a form the server runs")
        conn.connect(socket_path)
    except OSError:
        conn.close()
        os.execv(python, [python, *args])
    command.update(cwd=os.getcwd(), env=dict(os.environ))
    payload = json.dumps(command).encode()
    socket.send_fds(conn, [len(payload).to_bytes(8, "big")], [0, 1, 2])
    conn.sendall(payload)
    pid_line = _read_line(conn)
    if pid_line is None:
        sys.exit("warm command server: no process started")
    pid = int(pid_line)
    pid_file = os.environ.get("WARM_COMMAND_PID_FILE")
    if pid_file:  # for a test that looks for what the command left behind (its session)
        with open(pid_file, "w") as f:
            f.write(pid_line)

    def forward(signum, frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for number in FORWARDED:
        signal.signal(number, forward)
    status_line = _read_line(conn)
    if status_line is None:
        sys.exit("warm command server: the relay went away")
    code = os.waitstatus_to_exitcode(int(status_line))
    if code < 0:  # ended by a signal: end the same way
        if -code in FORWARDED:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
