"""The autotuner: candidates, the budget, one trial's isolation, the config writer, and
one whole search on the mlp recipe whose best config then runs through the trainer command."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

import pytest

from tests.support.helpers import REPO
from tests.support.autotune_jobs import job_for
from trainer.autotune import candidates as cands
from trainer.autotune import trial as trial_module
from trainer.autotune.best_config import check_same_config, compose_file, config_document, write_best_config
from trainer.autotune.budget import Budget, process_age_s
from trainer.autotune.runner import plan, run_candidates
from trainer.autotune.settings import AutotuneError, check_settings, load_job, split_overrides
from trainer.autotune.table import best, format_table
from trainer.autotune.trial import TrialResult, read_throughput

DEFAULT_BLOCK = {"budget_s": 300, "steps": 20, "warmup_steps": 5, "micro_batch_sizes": None,
                 "strategies": ["ddp", "ddp_zero1", "fsdp_grad_op", "fsdp_full"], "activation_checkpointing": None,
                 "out_dir": None}


# ----- candidates ------------------------------------------------------------------------------------
def test_candidates_on_mlp_keep_the_global_batch(tmp_path):
    job = job_for(["recipe=mlp", "trainer.devices=2"], tmp_path)
    batch, candidates = plan(job)
    assert (batch.size, batch.world, batch.micro) == (64, 2, 32)  # the recipe's 32 x accumulate 1 x 2 ranks
    # 4 strategies x {16, 32} (64 would need accumulation 1/2); the mlp has no blocks: checkpointing off only.
    assert len(candidates) == 8
    assert {c.strategy for c in candidates} == {"ddp", "ddp_zero1", "fsdp_grad_op", "fsdp_full"}
    assert [(c.micro_batch_size, c.accumulation) for c in candidates] == [(32, 1)] * 4 + [(16, 2)] * 4
    assert [c.strategy for c in candidates[:4]] == ["ddp", "ddp_zero1", "fsdp_grad_op", "fsdp_full"]
    assert all(c.micro_batch_size * c.accumulation * batch.world == 64 for c in candidates)
    assert not any(c.activation_checkpointing for c in candidates)
    zero1 = next(c for c in candidates if c.strategy == "ddp_zero1" and c.micro_batch_size == 16)
    assert zero1.overrides() == ["strategy=ddp", "strategy.zero1=true", "data.batch_size=16",
                                 "trainer.accumulate_grad_batches=2", "trainer.activation_checkpointing=false"]


def test_micro_batch_sizes_double_when_accumulation_allows_and_refuse_what_breaks_the_global_batch(tmp_path):
    job = job_for(["recipe=mlp", "trainer.devices=2", "trainer.accumulate_grad_batches=4"], tmp_path)
    batch = cands.global_batch(job.config)
    assert batch.size == 256 and cands.micro_batch_sizes(None, batch) == [16, 32, 64]
    assert cands.micro_batch_sizes([64, 8], batch) == [8, 64]
    with pytest.raises(AutotuneError, match=r"micro_batch_sizes: 48 .* allowed: \[1, 2, 4, 8, 16, 32, 64, 128\]"):
        cands.micro_batch_sizes([48], batch)
    # data.global_batch_size decides the global batch when set.
    job = job_for(["recipe=mlp", "trainer.devices=2", "data.global_batch_size=128"], tmp_path)
    assert cands.global_batch(job.config).size == 128
    with pytest.raises(AutotuneError, match="data.batch_size is unset"):
        cands.global_batch(job_for(["recipe=mlp", "data.batch_size=null"], tmp_path).config)
    with pytest.raises(AutotuneError, match="trainer.num_nodes=2"):
        cands.global_batch(job_for(["recipe=mlp", "trainer.num_nodes=2"], tmp_path).config)


def test_activation_checkpointing_options_follow_the_model_and_the_user(tmp_path):
    mlp = job_for(["recipe=mlp"], tmp_path).config.module
    gpt = job_for(["recipe=gpt"], tmp_path).config.module
    assert cands.model_has_blocks(mlp) is False and cands.model_has_blocks(gpt) is True
    assert cands.checkpointing_options(None, None, lambda: True) == [False, True]
    assert cands.checkpointing_options(None, None, lambda: False) == [False]
    assert cands.checkpointing_options(None, True, lambda: False) == [True]  # typed trainer.activation_checkpointing
    with pytest.raises(AutotuneError, match="no blocks to checkpoint"):
        cands.checkpointing_options([False, True], None, lambda: False)
    _, candidates = plan(job_for(["recipe=gpt", "trainer.devices=2", "autotune.strategies=[ddp]"], tmp_path))
    assert [(c.micro_batch_size, c.activation_checkpointing) for c in candidates] == [
        (16, False), (16, True), (8, False), (8, True)]  # the configured micro-batch first


def test_settings_and_overrides_are_checked():
    assert split_overrides(["recipe=mlp", "autotune.steps=3", "+foo=1"]) == (["recipe=mlp", "+foo=1"], ["autotune.steps=3"])
    for argv, message in ((["strategy=fsdp"], "chooses the strategy"), (["strategy.zero1=true"], "chooses the strategy"),
                          (["hydra.run.dir=x"], "trial's run directory"), (["trainer.seed=1,2"], "is a sweep"),
                          (["~trainer.seed"], "deleting a key"), (["-m"], "key=value overrides only")):
        with pytest.raises(AutotuneError, match=message):
            split_overrides(argv)
    for key, value, message in (("budget_s", 0, "budget_s must be"), ("steps", 0, "steps must be"),
                                ("strategies", ["ddp", "zero3"], "unknown strategy 'zero3'"),
                                ("micro_batch_sizes", [0], "micro_batch_sizes must be"),
                                ("activation_checkpointing", ["yes"], "activation_checkpointing must be")):
        with pytest.raises(AutotuneError, match=message):
            check_settings({**DEFAULT_BLOCK, key: value})
    settings = check_settings(DEFAULT_BLOCK)
    assert "outputs/autotune/" in str(settings.out_dir) and settings.out_dir.is_absolute()
    # Hydra's own refusals come back as one AutotuneError naming the override.
    for argv, message in ((["autotune.typo=1"], "autotune.typo"), (["recipe=nope"], "nope"), (["foo"], "foo"),
                          (["trainer.max_step=3"], r"^trainer.max_step=3: .*did you mean trainer.max_steps=3\?")):
        with pytest.raises(AutotuneError, match=message):
            load_job(argv)
    assert load_job(["recipe=mlp", "autotune.steps=3"]).settings.steps == 3


# ----- budget ------------------------------------------------------------------------------------------
class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_budget_starts_a_candidate_only_when_the_longest_so_far_fits(tmp_path):
    clock = FakeClock()
    budget = Budget(35, already_spent=1.0, clock=clock, margin_s=2.0)
    assert budget.left() == 32 and budget.can_start([])  # the first one: no estimate, time left
    job = job_for(["recipe=mlp", "trainer.devices=2"], tmp_path)
    _, candidates = plan(job)
    timeouts = []

    def fake_trial(candidate, overrides, settings, run_dir, timeout_s):
        timeouts.append(timeout_s)
        clock.now += 10.0
        return TrialResult(candidate, "ok", samples_per_s=100.0 + len(timeouts), peak_mb=1.0, seconds=10.0)

    results = run_candidates(candidates, job, budget, fake_trial)
    # Started at 1 s: after 3 trials 31 s are spent, 2 are left (35 - margin 2 - 31) < the 10 s estimate.
    assert [r.status for r in results] == ["ok"] * 3 + ["not run: budget"] * 5
    assert timeouts == [32.0, 22.0, 12.0]  # each trial may use at most what is left
    assert best(results) is results[2]
    table = format_table(results)
    assert table.splitlines()[0].split()[:3] == ["strategy", "micro-batch", "accum"]
    assert "ok, best" in table.splitlines()[4] and table.count("not run: budget") == 5
    assert 0 <= process_age_s() < 3600


# ----- one trial -----------------------------------------------------------------------------------------
def test_throughput_drops_the_warm_up_window(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"step": 2, "perf/step_time_s": 1.0, "perf/samples_per_s": 1.0},  # warm-up: dropped
             {"step": 4, "perf/step_time_s": 0.5, "perf/samples_per_s": 128.0},  # 2 steps, 1 s, 128 samples
             {"step": 5, "perf/step_time_s": 1.0, "perf/samples_per_s": 64.0},  # a short last window
             {"step": 5, "val/loss": 1.0}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert read_throughput(path) == (pytest.approx(192 / 2.0), 3)
    path.write_text(json.dumps(lines[0]) + "\n")
    with pytest.raises(ValueError, match="need the warm-up and one measured"):
        read_throughput(path)


@pytest.mark.parametrize("body, status", [
    ("print('starting'); print('error: trainer.devices must be >= 1, got 0'); sys.exit(1)",
     "failed: error: trainer.devices must be >= 1, got 0"),
    ("os.kill(os.getpid(), signal.SIGKILL)", "failed: killed by signal 9 (out of memory?)"),
    ("child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
     "open(os.environ['CHILD_PID_FILE'], 'w').write(str(child.pid)); time.sleep(60)",
     "failed: stopped at the time budget"),
])
def test_a_failing_trial_is_a_row_and_leaves_no_process(tmp_path, monkeypatch, body, status):
    script = tmp_path / "fake_train.py"
    script.write_text(f"import os, signal, subprocess, sys, time\n{body}\n")
    monkeypatch.setattr(trial_module, "TRAIN_COMMAND", [sys.executable, str(script)])
    monkeypatch.setenv("CHILD_PID_FILE", str(tmp_path / "child.pid"))
    candidate = cands.Candidate("ddp", 16, 2, False)
    settings = check_settings({**DEFAULT_BLOCK, "out_dir": str(tmp_path)})
    started = time.monotonic()
    result = trial_module.run_trial(candidate, ["recipe=mlp"], settings, tmp_path / "trial", timeout_s=2.0)
    assert result.status.startswith(status) and not result.ok
    assert time.monotonic() - started < 10
    log = (tmp_path / "trial" / trial_module.LOG_NAME).read_text()
    assert "recipe=mlp strategy=ddp data.batch_size=16" in log.splitlines()[0]  # the command, then its output
    if (tmp_path / "child.pid").exists():  # the launcher's own child (a rank) was killed with it
        pid = int((tmp_path / "child.pid").read_text())
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid)


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie waiting for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_peak_rss_covers_the_processes_a_trial_spawns(tmp_path):
    # The launcher stays small; its child (like a rank) holds 200 MB: os.wait4 reports the child's peak.
    child = "x = bytearray(200 * 1024 * 1024); x[::4096] = b'1' * len(x[::4096])"
    process = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}])"],
                               start_new_session=True)
    status, rss_mb, timed_out = trial_module._wait(process, 30.0)
    assert status == 0 and not timed_out and process.returncode == 0
    assert rss_mb > 200


# ----- the config file -------------------------------------------------------------------------------------
def test_best_config_composes_like_its_overrides(tmp_path):
    overrides = ["recipe=cnn", "trainer.devices=2", "logger=[jsonl,csv]", "+foo=1", "optimizer.lr=${trainer.seed}",
                 "strategy=fsdp", "strategy.sharding=grad_op", "data.batch_size=16", "trainer.accumulate_grad_batches=2"]
    document = config_document(overrides)
    assert document["defaults"] == ["config", {"override /recipe": "cnn"}, {"override /logger": ["jsonl", "csv"]},
                                    {"override /strategy": "fsdp"}, "_self_"]
    assert document["data"] == {"batch_size": 16} and document["optimizer"] == {"lr": "${trainer.seed}"}
    command = write_best_config(tmp_path / "best.yaml", overrides, "a comment\nline two")
    assert command.endswith(f"--config-path {tmp_path} --config-name best")
    text = (tmp_path / "best.yaml").read_text()
    assert text.startswith("# a comment\n# line two\n")
    cfg = compose_file(tmp_path / "best.yaml")
    assert (cfg.strategy.sharding, cfg.data.batch_size, cfg.trainer.accumulate_grad_batches) == ("grad_op", 16, 2)
    assert cfg.module._target_ == "trainer.recipes.cnn.DigitsCNN" and list(cfg.logger) == ["jsonl", "csv"]
    # The check can fail: a file that composes to something else is refused.
    (tmp_path / "best.yaml").write_text(text.replace("batch_size: 16", "batch_size: 8"))
    with pytest.raises(AutotuneError, match=r"another config than its overrides \(top-level keys \['data'\]\)"):
        check_same_config(tmp_path / "best.yaml", overrides)


def test_search_writes_table_results_and_best_config_and_reports_when_nothing_ran(tmp_path, capsys, monkeypatch):
    from trainer.autotune import autotune, runner
    from trainer.autotune.__main__ import main

    # The budget counts from the process's start (the command's own start-up); here that process is
    # pytest, whose age depends on the tests before this one.
    monkeypatch.setattr(runner, "process_age_s", lambda: 0.0)

    def fake_trial(candidate, overrides, settings, run_dir, timeout_s):
        if candidate.strategy == "fsdp_full":
            return TrialResult(candidate, "failed: killed by signal 9 (out of memory?)", seconds=1.0)
        return TrialResult(candidate, "ok", samples_per_s=float(candidate.micro_batch_size), peak_mb=300.0, seconds=1.0)

    argv = ["recipe=mlp", "trainer.devices=2", "trainer.max_steps=7", f"autotune.out_dir={tmp_path}"]
    outcome = autotune(argv, trial=fake_trial)
    printed = capsys.readouterr().out
    assert outcome.best.candidate == cands.Candidate("ddp", 32, 1, False)  # the fastest, the first of equals
    assert (tmp_path / "table.txt").read_text().startswith("strategy")
    assert len(json.loads((tmp_path / "results.json").read_text())) == 8
    assert "failed: killed by signal 9 (out of memory?)" in printed and f"run it with: {outcome.command}" in printed
    cfg = compose_file(tmp_path / "best.yaml")
    assert (cfg.strategy._target_, cfg.data.batch_size, cfg.trainer.max_steps) == (
        "trainer.strategies.ddp.DDPStrategy", 32, 7)  # the chosen candidate and the user's own overrides
    failed = autotune(argv, trial=lambda c, *args: TrialResult(c, "failed: boom", seconds=1.0))
    assert failed.best is None and failed.command is None and "no candidate ran through" in capsys.readouterr().out
    assert not (tmp_path / "best.yaml").exists()  # not the earlier search's
    assert main(["recipe=mlp", "strategy=fsdp"]) == 2
    assert "error: 'strategy=fsdp': the autotuner chooses the strategy" in capsys.readouterr().err


# ----- the whole search, then its best config ------------------------------------------------------------
# Enough for the 8 trials on an idle 2-core machine (about 5 s each); on a busy one the last ones are
# rows "not run: budget", which the test accepts: it checks that the search keeps to its budget.
BUDGET_S = 80


@pytest.fixture(scope="module")
def search(tmp_path_factory):
    """One search on the mlp recipe, 2 ranks (run from a temporary directory: outputs land there)."""
    work = tmp_path_factory.mktemp("autotune")
    argv = ["recipe=mlp", "trainer.devices=2", f"autotune.budget_s={BUDGET_S}", "autotune.steps=4",
            "autotune.warmup_steps=2", "trainer.max_steps=6", "trainer.val_every_n_steps=null"]
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "trainer.autotune", *argv], cwd=work, env=env,
                          capture_output=True, text=True, timeout=BUDGET_S + 30)
    return work, env, done, time.monotonic() - started


@pytest.mark.slow
def test_autotune_finishes_within_its_budget_and_its_best_config_runs(search):
    work, env, done, seconds = search
    print(done.stdout, f"\nthe search took {seconds:.1f} s")  # shown with -s or on a failure
    assert done.returncode == 0, done.stdout + done.stderr
    assert seconds < BUDGET_S, f"took {seconds:.0f} s of a {BUDGET_S} s budget"
    out_dir = next((work / "outputs" / "autotune").iterdir())
    results = json.loads((out_dir / "results.json").read_text())
    # The 8 candidates are each run or marked as not started for lack of time; none fails.
    assert len(results) == 8
    assert {r["candidate"]["strategy"] for r in results} == {"ddp", "ddp_zero1", "fsdp_grad_op", "fsdp_full"}
    assert all(r["status"] in ("ok", "not run: budget") for r in results), [r["status"] for r in results]
    measured = [r for r in results if r["status"] == "ok"]
    assert len(measured) >= 2 and all(r["samples_per_s"] > 0 and r["peak_mb"] > 50 for r in measured)
    assert all(r["extra"]["measured_steps"] == 4 for r in measured)
    # The table and the command are printed; the command runs the best config as is.
    assert "samples/s" in done.stdout and "peak MB" in done.stdout and "ok, best" in done.stdout
    command = next(line for line in done.stdout.splitlines() if line.startswith("run it with: "))
    argv = shlex.split(command[len("run it with: "):])
    assert argv[:3] == ["python", "-m", "trainer"] and argv[3:] == ["--config-path", str(out_dir), "--config-name", "best"]
    top = max(measured, key=lambda r: r["samples_per_s"])["candidate"]
    best_cfg = compose_file(out_dir / "best.yaml")
    assert (best_cfg.data.batch_size, best_cfg.trainer.accumulate_grad_batches) == (top["micro_batch_size"], top["accumulation"])
    ran = subprocess.run([sys.executable, *argv[1:]], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    logged = ran.stdout + ran.stderr
    strategy = "fsdp" if top["strategy"].startswith("fsdp") else "ddp"
    assert f"strategy {strategy}, world size 2, global batch 64 (batch {top['micro_batch_size']} x accumulate " \
           f"{top['accumulation']} x 2 ranks)" in logged
    assert "6 steps" in logged
