"""Checkpoints: exact resume after a kill, across formats, strategies and world sizes; atomic
commits; preemption; clear errors for bad files; consolidation.

Exact resume is bitwise on CPU (same world size): the model has dropout, so the random
generators must be restored too. Across world sizes / strategies the gradient sums are ordered
differently, so those runs are compared with rtol=1e-5 / atol=1e-6, and without dropout (the
per-rank random streams of another world size are different by design).
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.support.helpers import REPO, CheckpointedRegressor, fit, read_metrics
from tests.support.run_fit import run_fit
from trainer.checkpoint import CheckpointError, consolidate, layout
from trainer.strategies import resolve_strategy
from trainer.strategies.fsdp import FSDPStrategy

pytestmark = pytest.mark.timeout(300)
STEPS = 20  # 13 steps per epoch (200 samples, global batch 16): resumes cross an epoch boundary
EVERY = 3
KILL_AT = 8  # dies after step 8; the last checkpoint is step 6, in the middle of epoch 0
TOL = dict(rtol=1e-5, atol=1e-6)

LAYOUTS = {
    "single": dict(strategy="single", devices=1, batch_size=16),
    "ddp": dict(strategy="ddp", devices=2, batch_size=8),
    "fsdp": dict(strategy="fsdp", devices=2, batch_size=8),
    "zero1": dict(strategy={"name": "ddp", "zero1": True}, devices=2, batch_size=8),
    "pipeline": dict(strategy={"name": "pipeline", "schedule": "1f1b", "microbatches": 2}, devices=2, batch_size=16),
    "pipeline_x_fsdp": dict(strategy={"name": "pipeline", "stages": 2, "schedule": "interleaved_1f1b", "microbatches": 2,
                                      "partition": "uniform", "data_parallel": "fsdp"}, devices=4, batch_size=8),
}


def strategy_args(name):
    """LAYOUTS[name] with the strategy as an object (run_fit.py takes the JSON form)."""
    args = dict(LAYOUTS[name])
    if isinstance(args["strategy"], dict):
        options = dict(args["strategy"])
        args["strategy"] = resolve_strategy(options.pop("name"), **options)
    return args


def per_step_losses(run_dir):
    """The loss of each step; a step logged twice (before a kill and again after the resume)
    keeps its last value."""
    return {r["step"]: r["train/loss"] for r in read_metrics(str(run_dir)) if "train/loss" in r}


def run_in_subprocess(run_dir, module=None, **trainer):
    """``python tests/support/run_fit.py <spec>`` (a process of its own, forked warm: tests/support/warm_process.py)."""
    spec = {"run_dir": str(run_dir), "module": module or {}, "trainer": trainer}
    return run_fit(spec, timeout=240)


def checkpointed(path, layout_name, module=None, **options):
    args = dict(strategy_args(layout_name), max_steps=STEPS, checkpoint=dict(every_n_steps=EVERY, keep_last=None))
    args.update(options)
    return fit(path, module or CheckpointedRegressor(), **args)


@pytest.mark.parametrize(
    "layout_name, fmt",
    [("single", "sharded"), ("single", "full"), ("ddp", "sharded"), ("zero1", "sharded"), ("zero1", "full"),
     ("fsdp", "sharded"), ("fsdp", "full"), ("pipeline", "sharded"), ("pipeline_x_fsdp", "sharded")],
)
def test_killed_run_resumes_exactly(tmp_path, layout_name, fmt):
    reference_losses, reference_params = checkpointed(tmp_path / "whole", layout_name, checkpoint=dict(format=fmt))
    run_dir = tmp_path / "killed"
    args = dict(LAYOUTS[layout_name], max_steps=STEPS, checkpoint=dict(every_n_steps=EVERY, format=fmt))
    killed = run_in_subprocess(run_dir, {"kill_at_step": KILL_AT}, **args)
    assert killed.returncode != 0
    assert max(per_step_losses(run_dir)) == KILL_AT  # it really died at step 8 ...
    assert layout.find_latest(str(run_dir / "checkpoints")).endswith("step-000000006")  # ... after saving step 6
    fit(run_dir, CheckpointedRegressor(), resume="auto", **dict(args, **strategy_args(layout_name)))
    losses = per_step_losses(run_dir)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert [losses[s] for s in range(1, STEPS + 1)] == reference_losses  # bitwise
    params = torch.load(run_dir / "params.pt")
    for name, value in reference_params.items():
        assert torch.equal(params[name], value), name


def test_resume_with_augmenting_data_loader_workers_is_exact(tmp_path):
    # Random augmentation inside 2 data-loader workers: each batch's generators are seeded by its
    # position in the epoch, so the resumed run draws the same noise as the uninterrupted one.
    module = {"augment": True}
    args = dict(LAYOUTS["single"], max_steps=STEPS, num_workers=2, checkpoint=dict(every_n_steps=EVERY))
    reference_losses, _ = fit(tmp_path / "whole", CheckpointedRegressor(**module), **args)
    run_dir = tmp_path / "killed"
    assert run_in_subprocess(run_dir, dict(module, kill_at_step=KILL_AT), **args).returncode != 0
    fit(run_dir, CheckpointedRegressor(**module), resume="auto", **args)
    losses = per_step_losses(run_dir)
    assert [losses[s] for s in range(1, STEPS + 1)] == reference_losses
    # The augmentation really changes the data (else this test could not fail).
    plain, _ = fit(tmp_path / "plain", CheckpointedRegressor(), **args)
    assert plain[1:] != reference_losses[1:]


def test_async_save_resumes_exactly(tmp_path):
    options = dict(checkpoint=dict(every_n_steps=2, async_save=True, keep_last=None))
    reference = checkpointed(tmp_path / "whole", "fsdp", **options)
    committed = layout.committed_checkpoints(str(tmp_path / "whole" / "checkpoints"))
    assert [os.path.basename(p) for p in committed] == [layout.checkpoint_name(s) for s in range(2, STEPS + 1, 2)]
    # Resume from the middle one; the rest of the run must be the same.
    resumed_dir = tmp_path / "resumed"
    fit(resumed_dir, CheckpointedRegressor(), **LAYOUTS["fsdp"], max_steps=STEPS, resume=committed[4],
        checkpoint=dict(save_last=False))
    losses = per_step_losses(resumed_dir)
    assert sorted(losses) == list(range(11, STEPS + 1))
    assert [losses[s] for s in range(11, STEPS + 1)] == reference[0][10:]


@pytest.fixture(scope="module")
def ddp_without_dropout(tmp_path_factory):
    """The uninterrupted 2-rank DDP run without dropout (losses, final parameters) that the
    cross-strategy resumes below are compared with: one run, read by each of them."""
    return checkpointed(tmp_path_factory.mktemp("whole") / "whole", "ddp", module=CheckpointedRegressor(dropout=0.0))


@pytest.fixture(scope="module")
def fsdp_two_ranks_at_step_6(tmp_path_factory, ddp_without_dropout):
    """A 2-rank FSDP run without dropout, saved (sharded) at step 6, and its uninterrupted twin."""
    root = tmp_path_factory.mktemp("elastic")
    module = lambda: CheckpointedRegressor(dropout=0.0)  # noqa: E731
    checkpointed(root / "part", "fsdp", module=module(), max_steps=6)
    return module, ddp_without_dropout, str(root / "part" / "checkpoints")


@pytest.mark.parametrize("target", ["single", "fsdp4", "ddp"])
def test_sharded_checkpoint_resumes_on_other_world_sizes_and_strategies(tmp_path, fsdp_two_ranks_at_step_6, target):
    module, (reference_losses, reference_params), checkpoints = fsdp_two_ranks_at_step_6
    args = {
        "single": LAYOUTS["single"],
        "fsdp4": dict(strategy=FSDPStrategy(), devices=4, batch_size=4),
        "ddp": LAYOUTS["ddp"],
    }[target]
    losses, params = fit(tmp_path, module(), **args, max_steps=STEPS, resume=checkpoints)
    # The same global batches continue: steps 7..20 match the uninterrupted run.
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference_losses[6:]), **TOL)
    for name, value in reference_params.items():
        torch.testing.assert_close(params[name], value, **TOL, msg=name)


@pytest.mark.parametrize("data_parallel", ["ddp", "zero1"])
def test_ddp_checkpoint_to_fsdp_and_back(tmp_path, data_parallel, ddp_without_dropout):
    module = lambda: CheckpointedRegressor(dropout=0.0)  # noqa: E731
    reference_losses, reference_params = ddp_without_dropout
    checkpointed(tmp_path / "a", data_parallel, module=module(), max_steps=6)
    checkpointed(tmp_path / "b", "fsdp", module=module(), max_steps=13, resume=str(tmp_path / "a" / "checkpoints"))
    losses, params = checkpointed(tmp_path / "c", data_parallel, module=module(), resume=str(tmp_path / "b" / "checkpoints"))
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference_losses[13:]), **TOL)
    for name, value in reference_params.items():
        torch.testing.assert_close(params[name], value, **TOL, msg=name)


def test_consolidated_sharded_checkpoint_loads_into_one_process_model(tmp_path):
    losses, params = checkpointed(tmp_path / "run", "fsdp", max_steps=6)
    out = tmp_path / "model.pt"
    result = subprocess.run(
        [sys.executable, "-m", "trainer.checkpoint", "consolidate", str(tmp_path / "run" / "checkpoints"), str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "wrote" in result.stdout
    plain = CheckpointedRegressor()
    plain.configure_model()
    plain.load_state_dict(torch.load(out, weights_only=True))  # strict: every name present
    plain.eval()
    trained = CheckpointedRegressor()
    trained.configure_model()
    trained.load_state_dict(params)
    trained.eval()
    x = torch.randn(5, 6)
    assert torch.equal(plain(x), trained(x))


def test_interrupted_save_leaves_previous_checkpoint_loadable(tmp_path):
    checkpointed(tmp_path / "run", "single", max_steps=6)
    root = str(tmp_path / "run" / "checkpoints")
    assert layout.find_latest(root).endswith("step-000000006")
    # A save of step 9 that died half-way: its staging directory has a truncated file and no
    # COMMITTED marker. A "step" directory without the marker is never complete either.
    staging = layout.staging_path(root, 9)
    os.makedirs(os.path.join(staging, "model_optim"))
    with open(os.path.join(staging, "model_optim", "__0_0.distcp"), "wb") as f:
        f.write(b"\x00" * 100)
    os.makedirs(os.path.join(root, layout.checkpoint_name(12)))
    assert layout.find_latest(root).endswith("step-000000006")
    losses, _ = checkpointed(tmp_path / "run", "single", resume="auto")
    assert len(losses) == STEPS  # 6 log lines before + 14 after the resume from step 6
    assert not os.path.exists(staging)  # cleaned up by the next run


def test_kill_during_save_keeps_a_loadable_checkpoint(tmp_path):
    # Save a ~25 MB model (full format) every step and SIGKILL the process at a random moment,
    # mostly mid-save: resume=auto must always find a complete checkpoint that loads.
    run_dir = tmp_path / "run"
    module = {"width": 512, "depth": 6}
    import tests.support.run_fit as run_fit
    from tests.support.warm_process import start_in_warm_process

    # python tests/support/run_fit.py <spec>, in a process of its own forked warm (tests/support/warm_process.py)
    proc = start_in_warm_process(run_fit.main, ({
        "run_dir": str(run_dir), "module": module,
        "trainer": dict(LAYOUTS["single"], max_steps=1000, checkpoint=dict(every_n_steps=1, format="full", keep_last=2)),
    },), cwd=REPO)
    root = run_dir / "checkpoints"
    import time

    deadline = time.time() + 120
    while len(layout.committed_checkpoints(str(root))) < 2 and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.37)
    proc.kill()  # SIGKILL
    proc.join()
    latest = layout.find_latest(str(root))
    assert latest is not None
    from trainer.checkpoint.manager import load_training_state

    model = CheckpointedRegressor(**module)
    model.configure_model()
    load_training_state(latest, model, None, "full")  # raises if incomplete or corrupt


def test_sigterm_saves_and_exits_zero(tmp_path):
    run_dir = tmp_path / "run"
    args = dict(LAYOUTS["ddp"], max_steps=STEPS, checkpoint=dict(save_last=True))
    result = run_in_subprocess(run_dir, {"signal_at_step": 5, "signal_launcher": True}, **args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "preemption signal" in result.stderr
    stopped = max(per_step_losses(run_dir))
    # Stopped at the first step boundary after the signal reached a rank (forwarded by the
    # launcher, so it may land just after step 5's check), on both ranks together.
    assert stopped in (5, 6)
    assert layout.find_latest(str(run_dir / "checkpoints")).endswith(layout.checkpoint_name(stopped))
    losses, _ = fit(run_dir, CheckpointedRegressor(), resume="auto", **args)
    assert max(per_step_losses(run_dir)) == STEPS


def test_retention_keeps_last_and_best(tmp_path):
    module = CheckpointedRegressor(val_samples=20)
    fit(tmp_path, module, **LAYOUTS["single"], max_steps=12, val_every_n_steps=2,
        checkpoint=dict(every_n_steps=2, keep_last=2, monitor="val/loss", mode="max", keep_best=1))
    kept = [os.path.basename(p) for p in layout.committed_checkpoints(str(tmp_path / "checkpoints"))]
    val = {r["step"]: r["val/loss"] for r in read_metrics(str(tmp_path)) if "val/loss" in r}
    worst = max(val, key=val.get)  # mode=max keeps the highest: a step the last-2 rule would drop
    assert set(kept) == {layout.checkpoint_name(s) for s in {10, 12, worst}}


# ----- clear errors -------------------------------------------------------------------------------------------
def test_truncated_full_checkpoint_names_the_file(tmp_path):
    checkpointed(tmp_path / "run", "single", max_steps=3, checkpoint=dict(format="full"))
    latest = layout.find_latest(str(tmp_path / "run" / "checkpoints"))
    file = os.path.join(latest, "model_optim.pt")
    with open(file, "r+b") as f:
        f.truncate(os.path.getsize(file) // 2)
    # The size recorded at the commit catches it before the file is opened (tests/unit/checkpoint/test_checkpoint_integrity.py).
    with pytest.raises(CheckpointError, match=r"model_optim\.pt has \d+ bytes, the commit recorded \d+: the file is truncated"):
        checkpointed(tmp_path / "again", "single", resume=latest)


@pytest.mark.parametrize("fmt", ["sharded", "full"])
def test_checkpoint_of_another_model_is_a_clear_error(tmp_path, fmt):
    checkpointed(tmp_path / "run", "single", max_steps=3, checkpoint=dict(format=fmt))
    latest = layout.find_latest(str(tmp_path / "run" / "checkpoints"))
    with pytest.raises(CheckpointError, match=r"does not fit the model: .*shape mismatch: blocks\.0\.linear\.bias: "
                                              r"checkpoint \(32,\) vs model \(16,\)"):
        checkpointed(tmp_path / "wide", "single", module=CheckpointedRegressor(width=16), resume=latest)
    with pytest.raises(CheckpointError, match=r"missing keys: blocks\.3\.linear\.bias"):
        checkpointed(tmp_path / "deep", "single", module=CheckpointedRegressor(depth=4), resume=latest)


def test_resume_path_that_does_not_exist():
    from trainer import Trainer

    with pytest.raises(ValueError, match=r"trainer.resume='/no/such/ckpt' does not exist"):
        Trainer(resume="/no/such/ckpt")


def test_init_from_full_weights_on_fsdp(tmp_path):
    # Start a 2-rank FSDP run from a single-process run's consolidated weights: its first loss
    # equals a single-process run started from the same file.
    _, params = checkpointed(tmp_path / "source", "single", max_steps=4, checkpoint=None)
    weights = tmp_path / "weights.pt"
    torch.save(params, weights)
    single, _ = checkpointed(tmp_path / "single", "single", max_steps=2, checkpoint=None, init_from=str(weights),
                             module=CheckpointedRegressor(dropout=0.0))
    sharded, _ = checkpointed(tmp_path / "fsdp", "fsdp", max_steps=2, checkpoint=None, init_from=str(weights),
                              module=CheckpointedRegressor(dropout=0.0))
    torch.testing.assert_close(torch.tensor(sharded), torch.tensor(single), **TOL)


def test_torchrun_restart_resumes_from_latest_checkpoint(tmp_path):
    # torchrun --max-restarts 1: the first attempt dies at step 8 (SIGKILL on both ranks), torchrun
    # starts the workers again, and they continue from step 6 without being told to resume.
    reference_losses, reference_params = checkpointed(tmp_path / "whole", "ddp")
    run_dir = tmp_path / "elastic"
    spec = {"run_dir": str(run_dir), "module": {"kill_at_step": KILL_AT},
            "trainer": dict(LAYOUTS["ddp"], max_steps=STEPS, checkpoint=dict(every_n_steps=EVERY))}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--max-restarts", "1",
         "--master_addr", "127.0.0.1", "--master_port", str(_free_port()),
         os.path.join(REPO, "tests", "support", "run_fit.py"), json.dumps(spec)],
        capture_output=True, text=True, cwd=REPO, timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from" in result.stderr and "step-000000006" in result.stderr
    # torchrun sets OMP_NUM_THREADS=1, the spawned reference does not: CPU kernels then sum in
    # another order, so this comparison has a tolerance (resume itself is bitwise, tested above).
    losses = per_step_losses(run_dir)
    torch.testing.assert_close(torch.tensor([losses[s] for s in range(1, STEPS + 1)]), torch.tensor(reference_losses), **TOL)
    params = torch.load(run_dir / "params.pt")
    for name, value in reference_params.items():
        torch.testing.assert_close(params[name], value, **TOL, msg=name)


def _free_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_restarted_attempt_reuses_first_run_dir(tmp_path, monkeypatch):
    from trainer.runtime import elastic

    monkeypatch.chdir(tmp_path)
    first = {"TORCHELASTIC_RUN_ID": "job7", "TORCHELASTIC_RESTART_COUNT": "0"}
    elastic.record_run_dir("outputs/2026-11-21/10-00-00", first)
    assert elastic.pin_run_dir(["train.py", "x=1"], first) == ["train.py", "x=1"]
    restarted = dict(first, TORCHELASTIC_RESTART_COUNT="1")
    pinned = elastic.pin_run_dir(["train.py", "x=1"], restarted)
    assert pinned == ["train.py", "x=1", f"hydra.run.dir={tmp_path}/outputs/2026-11-21/10-00-00"]
    # The user's own run dir wins; another torchrun job (other run id) is not affected.
    assert elastic.pin_run_dir(["train.py", "hydra.run.dir=mine"], restarted) == ["train.py", "hydra.run.dir=mine"]
    assert elastic.pin_run_dir(["train.py"], dict(restarted, TORCHELASTIC_RUN_ID="other")) == ["train.py"]
    assert elastic.restart_count(restarted) == 1 and elastic.restart_count({}) == 0
