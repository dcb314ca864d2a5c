"""``hydra/launcher=submitit_slurm`` under a simulated SLURM: a sweep of 2 jobs becomes one job array of
2 tasks, each job on 2 nodes with one task per node (the ranks). ``sbatch``, ``srun`` and ``sacct`` are
stand-ins on PATH: ``sbatch`` answers with a job id as SLURM's does and then runs each array task's script
on this machine with the variables SLURM sets for it (its own job id, the array ids, the task counts, the
node list); ``srun`` starts the tasks with their ``SLURM_PROCID`` / ``SLURM_LOCALID`` / ``SLURM_NODEID`` and
submitit's output files. submitit itself pickles, runs and collects the jobs as on a cluster. Each job
trains as one process on the same global batch: losses equal to 1e-6 (CPU fp32)."""

from __future__ import annotations

import socket
import time

import pytest

from tests.support.command_line import FAST, TRAIN, assert_ok, assert_same_losses, assert_six_steps, run

pytest.importorskip("hydra_plugins.hydra_submitit_launcher")  # the slurm extra (meshtrainer[slurm])

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

FAKE_SBATCH = """#!{python}
import os, re, shlex, subprocess, sys, time
script_path = sys.argv[-1]
script = open(script_path).read()
def option(name, default):
    match = re.search(r"^#SBATCH --" + name + r"=(\\S+)", script, re.M)
    return match.group(1) if match else default
job_id = int(os.environ["FAKE_SLURM_JOB_ID"])
array = option("array", None)
count = int(re.match(r"0-(\\d+)", array).group(1)) + 1 if array else 1
nodes, per_node = int(option("nodes", "1")), int(option("ntasks-per-node", "1"))
if sys.argv[1] != "--run":
    # The cluster's processes are not the submitting command's: their own session, without the test's marker.
    env = {{k: v for k, v in os.environ.items() if k != "TRAINER_LAUNCH_TEST_MARKER"}}
    subprocess.Popen([sys.executable, __file__, "--run", script_path], env=env, start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(f"Submitted batch job {{job_id}}", flush=True)
    sys.exit(0)
folder = shlex.split([line for line in script.splitlines() if "submitit.core._submit" in line][0])[-1]
tasks = []
for index in range(count):
    array_id = f"{{job_id}}_{{index}}" if array else str(job_id)
    pickle = os.path.join(folder.replace("%j", array_id), f"{{array_id}}_submitted.pkl")
    while not os.path.exists(pickle):  # submitit moves the job's pickle there once sbatch answered
        time.sleep(0.2)
    env = dict(os.environ, SLURM_JOB_ID=str(job_id + 1 + index), SLURM_ARRAY_JOB_ID=str(job_id),
               SLURM_ARRAY_TASK_ID=str(index), SLURM_NTASKS=str(nodes * per_node), SLURM_NNODES=str(nodes),
               SLURM_JOB_NUM_NODES=str(nodes), SLURM_NTASKS_PER_NODE=str(per_node), SLURM_JOB_NODELIST="localhost")
    tasks.append(subprocess.Popen(["bash", script_path], env=env))
codes = [task.wait() for task in tasks]
with open(os.environ["FAKE_SLURM_DONE"] + ".tmp", "w") as done:
    done.write(",".join(map(str, codes)))
os.rename(os.environ["FAKE_SLURM_DONE"] + ".tmp", os.environ["FAKE_SLURM_DONE"])
"""

FAKE_SRUN = """#!{python}
import os, subprocess, sys
args = sys.argv[1:]
files = {{}}
while args and args[0].startswith("-"):
    flag = args.pop(0)
    if flag in ("--output", "--error"):
        files[flag] = args.pop(0)
env = os.environ
def path(pattern, task):
    return (pattern.replace("%A", env.get("SLURM_ARRAY_JOB_ID", "")).replace("%a", env.get("SLURM_ARRAY_TASK_ID", ""))
            .replace("%j", env["SLURM_JOB_ID"]).replace("%t", str(task)))
per_node = int(env["SLURM_NTASKS_PER_NODE"])
tasks = []
for rank in range(int(env["SLURM_NTASKS"])):
    out = open(path(files["--output"], rank), "a") if "--output" in files else None
    err = open(path(files["--error"], rank), "a") if "--error" in files else None
    tasks.append(subprocess.Popen(args, stdout=out, stderr=err, env=dict(
        env, SLURM_PROCID=str(rank), SLURM_LOCALID=str(rank % per_node), SLURM_NODEID=str(rank // per_node))))
codes = [task.wait() for task in tasks]
sys.exit(next((code for code in codes if code), 0))
"""

FAKE_SACCT = """#!/bin/sh
echo "JobID|State|NodeList"
"""


def _free_job_id(count: int) -> int:
    """A first job id whose array tasks' ports (15000 + id mod 20000, ids first+1 ...) are free now."""
    for first in range(7000, 19000, 7):
        ports = [15000 + (first + 1 + i) % 20000 for i in range(count)]
        free = True
        for port in ports:
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    free = False
        if free:
            return first
    raise RuntimeError("no free ports")


def _fake_cluster(tmp_path, monkeypatch) -> None:
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("srun", FAKE_SRUN), ("sacct", FAKE_SACCT)):
        (bin_dir / name).write_text(text.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("FAKE_SLURM_JOB_ID", str(_free_job_id(2)))
    monkeypatch.setenv("FAKE_SLURM_DONE", str(tmp_path / "cluster_done"))


def _cluster_finished(tmp_path) -> str:
    """The array tasks' exit codes, once every task of the simulated cluster ended (submitit collects a
    job's result as soon as its pickle is written, a moment before its processes have exited)."""
    done = tmp_path / "cluster_done"
    deadline = time.monotonic() + 120
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert done.exists(), "the simulated cluster's tasks did not end"
    return done.read_text()


def test_an_array_of_two_jobs_on_two_nodes_each_trains_as_one_process(tmp_path, monkeypatch):
    # One process with the global batch of 2 ranks x 32.
    single = run(TRAIN + ["-m", *FAST, "strategy=single", "data.batch_size=64", "logger=[jsonl]",
                          "checkpoint.save_last=false", "trainer.seed=1,2", f"hydra.sweep.dir={tmp_path / 'single'}"])
    assert_ok(single)
    _fake_cluster(tmp_path, monkeypatch)
    sweep = tmp_path / "slurm"
    launched = run(TRAIN + ["-m", "hydra/launcher=submitit_slurm", "hydra.launcher.gpus_per_node=null", *FAST,
                            "strategy=ddp", "trainer.devices=1", "trainer.num_nodes=2", "data.batch_size=32",
                            "logger=[jsonl]", "checkpoint.save_last=false", "trainer.seed=1,2",
                            f"hydra.sweep.dir={sweep}"], timeout=500)
    assert_ok(launched)
    assert _cluster_finished(tmp_path) == "0,0"  # both array tasks' scripts (srun and its tasks) exited 0
    script = next(sweep.glob(".submitit/*/*_submission.sh")).read_text()
    assert "#SBATCH --array=0-1" in script and "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=1" in script
    logs = "\n".join(p.read_text() for p in sorted(sweep.glob(".submitit/*/*_log.*")))
    assert logs.count("strategy ddp, world size 2") == 2, logs[-3000:]
    for job in ("0", "1"):
        assert_same_losses(assert_six_steps(sweep / job), assert_six_steps(tmp_path / "single" / job), rtol=1e-6)
