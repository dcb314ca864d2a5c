"""The job script of docs/how-to/slurm.md, as written, under a simulated SLURM: ``srun`` and ``scontrol``
are stand-ins on PATH (``srun`` starts SLURM_NTASKS tasks on this machine with the variables a real one sets
and passes SIGUSR1 / SIGTERM on to them, as SLURM's does; ``scontrol`` expands the node list and records a
requeue). The script trains 2 ranks; SIGUSR1 to it (SLURM's ``--signal=B:USR1``) makes the ranks save
and exit 0 and the script requeue the job; the requeued job (same id) resumes from that checkpoint and
finishes."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.support.helpers import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
PAGE = os.path.join(REPO, "docs", "how-to", "slurm.md")

FAKE_SRUN = """#!{python}
import os, signal, subprocess, sys
args = sys.argv[1:]
while args and args[0].startswith("-"):  # srun's own options (--kill-on-bad-exit=1)
    args.pop(0)
tasks = [subprocess.Popen(args, env={{**os.environ, "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i), "SLURM_NODEID": "0"}})
         for i in range(int(os.environ["SLURM_NTASKS"]))]
def forward(signum, frame):
    for task in tasks:
        if task.poll() is None:
            task.send_signal(signum)
for number in (signal.SIGUSR1, signal.SIGTERM):
    signal.signal(number, forward)
codes = [task.wait() for task in tasks]
sys.exit(next((code for code in codes if code), 0))
"""
FAKE_SCONTROL = """#!/bin/sh
case "$1 $2" in
  "show hostnames") echo localhost ;;
  "requeue "*) echo "$2" >> "$FAKE_SLURM_REQUEUED" ;;
  *) echo "scontrol stand-in: $*" >&2; exit 2 ;;
esac
"""


def job_script() -> str:
    with open(PAGE) as handle:
        page = handle.read()
    match = re.search(r'^```bash title="train.sbatch"\n(.*?)^```$', page, re.M | re.S)
    assert match, "docs/how-to/slurm.md has no train.sbatch block"
    return match.group(1)


def _job_id() -> int:
    """A job id whose port (15000 + id mod 20000, as the script computes it) is free now."""
    for job_id in range(os.getpid() % 20000, 20000 * 2):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", 15000 + job_id % 20000))
            except OSError:
                continue
        return job_id
    raise RuntimeError("no free port in 15000-34999")


def _environment(bin_dir, requeued) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not re.fullmatch(r"(SLURM_.*|RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|MASTER_.*|TORCHELASTIC_.*|"
                               r"TRAINER_SPAWNED|HYDRA_FULL_ERROR|WANDB_.*)", k)}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", PYTHONPATH=REPO, FAKE_SLURM_REQUEUED=str(requeued),
               SLURM_JOB_ID=str(_job_id()), SLURM_JOB_NODELIST="localhost", SLURM_NTASKS="2",
               SLURM_NTASKS_PER_NODE="2", SLURM_JOB_NUM_NODES="1", SLURM_NNODES="1", SLURM_CPUS_PER_TASK="1")
    return env


def _bin_dir(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if os.path.exists(os.path.join(REPO, "trainer", "__main__.py")):
        trainer = f'exec "{sys.executable}" -m trainer "$@"'
    else:
        trainer = f'exec "{sys.executable}" "{REPO}/train.py" "$@"'
    for name, text in (("srun", FAKE_SRUN.format(python=sys.executable)), ("scontrol", FAKE_SCONTROL),
                       ("trainer", f"#!/bin/sh\n{trainer}\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return bin_dir


RUN = ["recipe=mlp", "trainer.log_every_n_steps=5", "trainer.val_every_n_steps=null", "trainer.progress_bar=false",
       "trainer.num_sanity_val_steps=0"]


def _start(tmp_path, env, overrides):
    return subprocess.Popen(["bash", "train.sbatch", *RUN, *overrides], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _finish(job, timeout=150) -> str:
    try:
        output, _ = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        output, _ = job.communicate()
        pytest.fail(f"the job script did not end in {timeout} s:\n{output[-6000:]}")
    return output


def _train_rows(run_dir) -> list[dict]:
    """The training rows of metrics.jsonl so far (none before the file exists; a line being written is left out)."""
    try:
        with open(run_dir / "metrics.jsonl") as handle:
            lines = handle.read().split("\n")[:-1]
    except FileNotFoundError:
        return []
    return [row for row in map(json.loads, lines) if "train/loss" in row]


def _latest_step(run_dir) -> int:
    saved = sorted(name for name in os.listdir(run_dir / "checkpoints") if name.startswith("step-"))
    assert saved, f"no checkpoint in {run_dir / 'checkpoints'}"
    with open(run_dir / "checkpoints" / saved[-1] / "trainer_state.json") as handle:
        return json.load(handle)["step"]


def test_the_job_script_trains_is_requeued_on_its_signal_and_resumes(tmp_path):
    (tmp_path / "train.sbatch").write_text(job_script())
    requeued = tmp_path / "requeued"
    env = _environment(_bin_dir(tmp_path), requeued)
    run_dir = tmp_path / "outputs" / f"slurm-{env['SLURM_JOB_ID']}"

    # First run: far more steps than it gets to do; SIGUSR1 to the script once the ranks train.
    first = _start(tmp_path, env, ["trainer.max_steps=100000"])
    deadline = time.monotonic() + 120
    while not _train_rows(run_dir):
        assert first.poll() is None and time.monotonic() < deadline, _finish(first)
        time.sleep(0.2)
    first.send_signal(signal.SIGUSR1)
    output = _finish(first)
    assert first.returncode == 0, output[-6000:]
    assert "strategy fsdp, world size 2" in output, output[-6000:]
    assert requeued.read_text().split() == [env["SLURM_JOB_ID"]]  # scontrol requeue <this job>
    stopped_at = _latest_step(run_dir)
    assert 5 <= stopped_at < 100000
    first_rows = _train_rows(run_dir)

    # The requeued job: same id, same run dir; it resumes where the first stopped and finishes.
    requeued.unlink()
    second = _start(tmp_path, env, [f"trainer.max_steps={stopped_at + 10}"])
    output = _finish(second)
    assert second.returncode == 0, output[-6000:]
    assert not requeued.exists()
    rows = _train_rows(run_dir)
    resumed = rows[len(first_rows):]
    assert [r["step"] for r in resumed] == list(range(stopped_at + 5, stopped_at + 11, 5)), output[-6000:]
    assert all(r["train/loss"] == pytest.approx(r["train/loss"]) for r in rows)  # finite (NaN != NaN)
    assert resumed[-1]["train/loss"] < first_rows[0]["train/loss"] * 0.5  # it trained
    assert _latest_step(run_dir) == stopped_at + 10  # save_last
