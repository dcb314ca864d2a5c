"""Every shell command and Python block of README.md and docs/ runs as written (tests/support/doc_blocks.py
says how a page is read). One test per page: its blocks run in order in one fresh directory, where
``trainer`` is this checkout's command (``python -m trainer``) and ``python`` the suite's interpreter.
Both run warm (tests/support/warm_commands.py): forked from a server that imported torch and the
trainer once, each command as its own process with its arguments, directory, environment, output,
signals and exit status; ``torchrun`` and ``python -c`` start fresh interpreters."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.support.doc_blocks import SHELL, page_blocks, pages, skipped
from tests.support.helpers import REPO
from tests.support.warm_commands import WarmCommandServer, session_server

#: The blocks that do not run here, each for the reason its first line gives. Adding one is a change here.
EXPECTED_SKIPS = {
    "README.md": 1,  # the quick start: .ci/run runs exactly these two commands on a fresh machine
    "docs/quickstart.md": 1,  # a new environment and its downloads
    "docs/how-to/multi-node.md": 1,  # two machines
    "docs/development.md": 2,  # a new environment; parts of this suite
    "docs/how-to/logging.md": 1,  # an upload to a W&B account
    "docs/benchmarks.md": 1,  # benchmarks: minutes each, meaningful only on an idle machine
    "docs/how-to/slurm.md": 2,  # sbatch and submitit_slurm on a cluster (the page's simulated srun run and submitit_local run here)
    "docs/how-to/nd-parallelism.md": 1,  # 8 processes of the llama recipe (their layouts are tested small in tests/)
    "docs/lightning-examples.md": 1,  # Lightning's example programs, read from a clone of Lightning's repository
}

# Variables of the caller's shell that would change what a run does (a W&B account, Hydra's tracebacks).
_DROPPED = ("WANDB_API_KEY", "HYDRA_FULL_ERROR", "WANDB_MODE")


@pytest.fixture
def warm_server():
    return session_server()


def _command_dir(tmp_path, server: WarmCommandServer) -> str:
    """A folder put first on PATH: ``trainer``, ``python`` and ``torchrun`` of this checkout and interpreter
    (the first two through the warm server)."""
    bin_dir = tmp_path / "_bin"
    bin_dir.mkdir()
    scripts = {
        "trainer": server.command_line("-m trainer"),
        "python": server.command_line(""),
        "python3": server.command_line(""),
        "torchrun": f'exec "{sys.executable}" -m torch.distributed.run "$@"',
    }
    for name, line in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{line}\n")
        path.chmod(0o755)
    return str(bin_dir)


def _environment(bin_dir: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _DROPPED}
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run(command, cwd, env, timeout=600) -> subprocess.CompletedProcess:
    """Run one block in its own process group, so that a block that hangs is ended with every process
    it started (a trainer's workers, a command sent to the background)."""
    proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        stderr += f"\n(killed after {timeout} s)"
    return subprocess.CompletedProcess(command, proc.returncode, stdout, stderr)


@pytest.mark.slow
@pytest.mark.parametrize("page", sorted(page_blocks()))
def test_page_runs_as_written(page, tmp_path, warm_server):
    bin_dir = _command_dir(tmp_path, warm_server)
    work = tmp_path / "work"
    work.mkdir()
    env = _environment(bin_dir)
    for block in page_blocks()[page]:
        if block.title:  # a file the reader saves: later blocks use it
            target = work / block.title
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.body)
            if block.lang == "python":
                compile(block.body, block.where, "exec")
            continue
        if not block.runs:
            continue
        name = f"_block_{block.line}." + ("py" if block.lang == "python" else "sh")
        (work / name).write_text(block.body)
        command = [os.path.join(bin_dir, "python"), name] if block.lang == "python" else ["bash", "-euo", "pipefail", name]
        done = _run(command, work, env)
        assert done.returncode == 0, (
            f"{block.where} exited {done.returncode}\n--- block:\n{block.body}--- stdout (end):\n"
            f"{done.stdout[-3000:]}\n--- stderr (end):\n{done.stderr[-5000:]}"
        )


def test_blocks_that_do_not_run_are_the_listed_ones():
    found: dict[str, int] = {}
    for block in skipped():
        assert block.skip_reason, f"{block.where}: the opt-out line must give a reason"
        found[block.page] = found.get(block.page, 0) + 1
    # Printed with -rA / -s: the blocks that opt out, and why.
    for block in skipped():
        print(f"not run: {block.where}: {block.skip_reason}")
    assert found == EXPECTED_SKIPS


def test_every_page_is_read_and_has_fences_closed():
    from tests.support.doc_blocks import blocks

    assert "README.md" in pages() and "docs/index.md" in pages()
    for page in pages():
        with open(os.path.join(REPO, page), encoding="utf-8") as f:
            text = f.read()
        runnable = [b for b in blocks(page) if b.lang in SHELL + ("python",)]
        # An unclosed fence would swallow the rest of the page: every fence line is paired.
        fences = [line for line in text.splitlines() if line.strip().startswith("```")]
        assert len(fences) % 2 == 0, f"{page}: an unclosed ``` fence"
        for block in runnable:
            assert block.body.strip(), f"{block.where}: an empty block"
