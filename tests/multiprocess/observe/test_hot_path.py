"""The hot path: a step that is not a logging step makes no host sync and no collective besides the
allowed ones, under every strategy, with token normalisation, fp16 and
checkpointing (save_on_signal on, its default) all on. A NaN loss still stops the run, naming its
step, and no checkpoint of a NaN state is committed."""

import os

import pytest

from tests.support.helpers import FusedAdamWTokens, HotPathProbe, OverflowAt, PythonCountTokens, VariableLengthTokens, read_hot_path, run_trainer
from trainer.checkpoint import layout
from trainer.runtime.comms_log import GRADIENT_KIND, OVERFLOW_KIND, TOKEN_COUNT_KIND
from trainer.precision import Precision
from trainer.strategies.ddp import DDPStrategy
from trainer.strategies.fsdp import FSDPStrategy
from trainer.strategies.pipeline import PipelineStrategy

pytestmark = pytest.mark.timeout(300)

LOG_EVERY = 4
STEPS = 8
# The windows that follow a non-logging step and end at one (HotPathProbe: the window of step k
# also holds what ran after step k-1's end hook): steps 3, 6, 7 with logging steps 4 and 8. Step 2's
# window holds one-time set-up (DDP rebuilds its buckets in the first forward after the first
# backward: two broadcasts).
QUIET = [k for k in range(3, STEPS + 1) if k % LOG_EVERY not in (0, 1)]

LAYOUTS = {
    # name: (strategy, devices, accumulate_grad_batches, collective kinds allowed on a quiet step)
    "single": (lambda: "single", 1, 2, set()),
    # DDP: fp16's overflow flag is not all-reduced (the gradients are already equal on every rank).
    "ddp": (DDPStrategy, 2, 2, {GRADIENT_KIND, TOKEN_COUNT_KIND}),
    "fsdp_full": (lambda: FSDPStrategy(sharding="full"), 2, 2,
                  {"all_gather", "reduce_scatter", TOKEN_COUNT_KIND, OVERFLOW_KIND}),
    "fsdp_grad_op": (lambda: FSDPStrategy(sharding="grad_op"), 2, 2,
                     {"all_gather", "reduce_scatter", TOKEN_COUNT_KIND, OVERFLOW_KIND}),
    "pipeline": (lambda: PipelineStrategy(microbatches=2), 2, 2, {"send_recv", TOKEN_COUNT_KIND, OVERFLOW_KIND}),
}


def probe(run_dir, layout_name, module, precision="fp16-mixed", accumulate=None, **args):
    strategy, devices, default_accumulate, allowed = LAYOUTS[layout_name]
    accumulate = accumulate or default_accumulate
    if precision == "fp16-mixed":  # 2**16 overflows at first here: a skipped step costs the same
        precision = Precision("fp16-mixed", initial_scale_power=8)
    run_trainer(run_dir, module, strategy=strategy(), devices=devices, accumulate_grad_batches=accumulate,
                batch_size=4, max_steps=STEPS, log_every_n_steps=LOG_EVERY, loss_normalization="tokens",
                precision=precision, callbacks=[HotPathProbe()], checkpoint=dict(every_n_steps=LOG_EVERY), **args)
    return read_hot_path(run_dir, devices), allowed


@pytest.mark.parametrize("layout_name, precision", [(name, "fp16-mixed") for name in LAYOUTS]
                         + [("single", "fp16-sgd"), ("single", "fp32"), ("ddp", "fp32")])
def test_quiet_steps_make_no_host_sync_and_only_allowed_collectives(tmp_path, layout_name, precision):
    # fp16 with a fused AdamW: the optimizer skips an overflow on the device flag, no host read.
    # fp16 with a plain SGD ("fp16-sgd"): one host read, the overflow decision its step depends on
    # (as DeepSpeed's and torch's GradScaler's); nothing else reads the device.
    module = FusedAdamWTokens() if precision == "fp16-mixed" else PythonCountTokens()
    ranks, allowed = probe(tmp_path, layout_name, module,
                           precision="fp16-mixed" if precision == "fp16-sgd" else precision)
    expected = 1 if precision == "fp16-sgd" else 0
    for rank, windows in enumerate(ranks):
        for step in QUIET:
            window = windows[step]
            assert window["syncs"] == expected, (rank, step, window["where"])
            assert all(w.startswith("fp16_step.py") for w in window["where"]), (rank, step, window["where"])
            assert set(window["collectives"]) <= allowed, (rank, step, window["collectives"])
        if layout_name != "single":  # (fp32: no overflow agreement)
            assert all(windows[k]["collectives"].get(TOKEN_COUNT_KIND) == 1 for k in QUIET)
        # Logging steps settle what the quiet ones left (metrics, the non-finite check, signals).
        assert windows[LOG_EVERY]["syncs"] > 0


def test_grad_op_gathers_once_per_optimizer_step(tmp_path):
    # With 2 micro-batches per step the parameters stay gathered through the window: as many
    # all-gathers as without accumulation.
    gathers = []
    for accumulate in (1, 2):
        ranks, _ = probe(tmp_path / str(accumulate), "fsdp_grad_op", PythonCountTokens(), accumulate=accumulate)
        gathers.append(ranks[0][QUIET[0]]["collectives"]["all_gather"])
    assert gathers[0] == gathers[1]


# ----- the late non-finite check ------------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["fp32", "fp16-mixed"])
def test_nan_loss_stops_naming_its_step_and_no_nan_checkpoint_is_committed(tmp_path, precision):
    # Logged every 10 steps, saved every 2: the NaN of step 3 is noticed before the save of step 4,
    # which is never written; the error names step 3. Under fp16 a NaN loss (not an inf one, an
    # overflow) stops the run too.
    chosen = Precision("fp16-mixed", initial_scale_power=8) if precision == "fp16-mixed" else precision
    with pytest.raises(FloatingPointError, match=r"non-finite training loss at step 3 \(epoch 0\) on rank 0 "
                                                 r"\(noticed at step 4\)"):
        run_trainer(tmp_path, OverflowAt(bad_step=3, value=float("nan")), batch_size=16, max_steps=10,
                    log_every_n_steps=10, precision=chosen, checkpoint=dict(every_n_steps=2, keep_last=None))
    committed = [os.path.basename(p) for p in layout.committed_checkpoints(str(tmp_path / "checkpoints"))]
    assert committed == [layout.checkpoint_name(2)]


def test_a_signal_is_agreed_on_logging_steps_and_every_n_steps(tmp_path, monkeypatch):
    # Several processes: the preemption agreement (a CPU all-reduce) runs on logging steps and, with
    # checkpoint.signal_check_every_n_steps=N, every N steps; never on the other steps.
    from trainer.checkpoint import manager as manager_module
    from trainer.checkpoint.config import CheckpointConfig

    agreed = []
    monkeypatch.setattr(manager_module.distributed, "is_distributed", lambda: True)
    monkeypatch.setattr(manager_module.distributed, "any_rank", lambda flag: agreed.append(step) or flag)
    for every, expected in [(None, [4, 8]), (3, [3, 4, 6, 8, 9])]:
        agreed.clear()
        manager = manager_module.CheckpointManager(CheckpointConfig(signal_check_every_n_steps=every), str(tmp_path))
        manager._signalled = 15  # a signal arrived before step 1: only an agreement step acts on it
        for step in range(1, 10):
            assert manager.stop_requested(step, logging_step=step % 4 == 0) == (step in expected)
        assert agreed == expected


def test_tensor_token_counts_stay_on_the_device(tmp_path):
    # A module that returns its token count as a tensor: summed on the device, no host read.
    ranks, _ = probe(tmp_path, "single", VariableLengthTokens(), precision="fp32")
    assert all(ranks[0][step]["syncs"] == 0 for step in QUIET), ranks[0]


def test_sigterm_between_logging_steps_saves_at_the_next_one(tmp_path):
    # 2 ranks, logged every 4 steps: a SIGTERM after step 5 stops and saves at step 8 (the bound:
    # log_every_n_steps), exit code 0, on both ranks together.
    from tests.multiprocess.checkpoint.test_checkpoint import run_in_subprocess

    run_dir = tmp_path / "run"
    result = run_in_subprocess(run_dir, {"signal_at_step": 5, "signal_launcher": True}, strategy="ddp", devices=2,
                               batch_size=8, max_steps=20, log_every_n_steps=4, checkpoint=dict(save_last=True))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "preemption signal: saving at step 8" in result.stderr
    assert layout.find_latest(str(run_dir / "checkpoints")).endswith(layout.checkpoint_name(8))
