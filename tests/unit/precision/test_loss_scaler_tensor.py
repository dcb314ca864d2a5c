"""The device-resident loss scaler (trainer/precision/scaler_state.py) follows the former host logic;
the sync-free fp16 step (trainer/precision/fp16_step.py) skips in the optimizer's kernel.

``Reference`` below is the former plain-Python ``DynamicLossScaler.update`` (DeepSpeed's rules), kept
tiny; the tensor scaler must give the same scale and counters after every step of random overflow
sequences, for several knob settings, without reading anything to the host.
"""

import random

import pytest
import torch

from tests.support.helpers import HostSyncCounter, read_metrics, run_trainer
from tests.unit.optim.test_optimizers import LR, ScheduledOverflow
from trainer.precision.fp16_step import SkipReport, supports_sync_free, sync_free_step
from trainer.precision import Precision
from trainer.precision.loss_scaler import DynamicLossScaler


class Reference:
    """The former host implementation of the update rule."""

    def __init__(self, initial_scale_power=16, loss_scale_window=1000, hysteresis=2, min_loss_scale=1.0,
                 static_loss_scale=None, consecutive_hysteresis=False):
        self.window, self.hysteresis, self.min = loss_scale_window, hysteresis, float(min_loss_scale)
        self.dynamic, self.consecutive = static_loss_scale is None, consecutive_hysteresis
        self.scale = float(static_loss_scale) if static_loss_scale is not None else 2.0**initial_scale_power
        self.tracker, self.budget, self.skipped, self.overflows, self.in_a_row = 0, hysteresis, 0, 0, 0

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.skipped += 1
            self.overflows += 1
            self.in_a_row += 1
            if self.dynamic:
                if self.budget > 1:
                    self.budget -= 1
                else:
                    self.scale = max(self.scale / 2, self.min)
                self.tracker = 0
            return
        self.in_a_row = 0
        if not self.dynamic:
            return
        if self.consecutive:
            self.budget = self.hysteresis
        self.tracker += 1
        if self.tracker >= self.window:
            self.scale = min(self.scale * 2, 2.0**126)
            self.budget, self.tracker = self.hysteresis, 0

    def state(self) -> tuple:
        return self.scale, self.tracker, self.budget, self.skipped, self.overflows, self.in_a_row


def state_of(scaler: DynamicLossScaler) -> tuple:
    return (scaler.scale, scaler.growth_tracker, scaler.cur_hysteresis, scaler.skipped_steps, scaler.overflows,
            scaler.consecutive_overflows)


KNOBS = [
    dict(initial_scale_power=6, loss_scale_window=3, hysteresis=1),
    dict(initial_scale_power=10, loss_scale_window=4, hysteresis=3, min_loss_scale=3.0),
    dict(initial_scale_power=8, loss_scale_window=2, hysteresis=2, consecutive_hysteresis=True),
    dict(initial_scale_power=125, loss_scale_window=1, hysteresis=1),  # hits the 2**126 cap
    dict(initial_scale_power=2, loss_scale_window=5, hysteresis=4, min_loss_scale=2.0**-126),
    dict(static_loss_scale=3.0, loss_scale_window=2, hysteresis=1),
]


@pytest.mark.parametrize("knobs", KNOBS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_tensor_update_follows_the_host_logic_on_random_overflows(knobs, p):
    rng = random.Random(hash((p, tuple(knobs.items()))) % 2**32)
    pattern = [rng.random() < p for _ in range(300)]
    reference, scaler = Reference(**knobs), DynamicLossScaler(**knobs)
    scaler.scale_loss(torch.tensor(1.0))  # (state on the loss's device)
    scales = set()
    for step, overflow in enumerate(pattern):
        grads = [torch.full((3,), 2.0 * scaler.scale), torch.full((2,), -1.0)]
        if overflow:
            grads[0][1] = float("inf")
        with HostSyncCounter() as syncs:
            found = scaler.unscale_found_inf(grads)
            scaler.update(found)
        assert syncs.count == 0, syncs.where
        reference.update(overflow)
        assert state_of(scaler) == reference.state(), f"step {step} ({knobs}, p={p})"
        scales.add(reference.scale)
    if "static_loss_scale" not in knobs:
        assert len(scales) >= 2, "the sequence must move the scale"


def test_a_bool_found_inf_and_the_device_flag_give_the_same_state():
    a, b = DynamicLossScaler(initial_scale_power=4, loss_scale_window=2), DynamicLossScaler(initial_scale_power=4,
                                                                                          loss_scale_window=2)
    for overflow in (True, True, False, False, False, True):
        a.update(overflow)
        b.update(torch.tensor(1.0 if overflow else 0.0))
    assert state_of(a) == state_of(b) and a.state_dict() == b.state_dict()


@pytest.mark.parametrize("name", ["AdamW", "SGD"])
def test_a_fused_optimizer_skips_on_the_device_flag(name):
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    options = dict(lr=0.1, momentum=0.9) if name == "SGD" else dict(lr=0.1)
    optimizer = getattr(torch.optim, name)([w], fused=True, **options)
    assert supports_sync_free(optimizer) and not supports_sync_free(torch.optim.AdamW([w]))
    for found, moves in ((0.0, True), (1.0, False), (0.0, True)):
        before = w.detach().clone()
        w.grad = torch.tensor([0.5, float("inf")]) if found else torch.tensor([0.5, 0.25])
        with HostSyncCounter() as syncs:
            sync_free_step(optimizer, torch.tensor(found), optimizer.step)
        assert syncs.count == 0
        assert not hasattr(optimizer, "found_inf")
        assert torch.equal(w.detach(), before) is not moves
        assert torch.isfinite(w).all()
    if name == "AdamW":  # the skipped step is not counted by the optimizer either
        assert int(optimizer.state[w]["step"]) == 2


def test_skip_report_names_the_steps_skipped_since_the_last_log(caplog):
    report = SkipReport()
    report.sync(2)  # two skipped before a resume: not reported again
    with caplog.at_level("INFO", logger="trainer.precision.fp16_step"):
        report.report(10, 2, 1024.0)
        report.report(20, 5, 256.0)
    assert [r.getMessage() for r in caplog.records] == [
        "step 20: 3 steps skipped for a gradient overflow since the last log, loss scale now 256"]


def test_sync_free_skipped_step_still_advances_the_schedule(tmp_path):
    # The documented cost of the sync-free path (as torch.amp.GradScaler's): the host does not know
    # step 3 was skipped, so the schedule counts it (the host path does not: tests/unit/optim/test_optimizers.py).
    module = ScheduledOverflow(fused=True, bad_step=3)
    run_trainer(tmp_path, module, max_steps=6, batch_size=16,
                precision=Precision("fp16-mixed", initial_scale_power=10, hysteresis=1))
    skipped = {r["step"]: r["train/skipped_steps"] for r in read_metrics(str(tmp_path)) if "train/skipped_steps" in r}
    assert skipped == {1: 0, 2: 0, 3: 1, 4: 1, 5: 1, 6: 1}
    # on_before_optimizer_step ran on steps 1, 2, 4, 5, 6 (step 3 is a logging step: known skipped, no hook).
    assert module.lrs == [LR, LR, LR / 2, LR / 4, LR / 4]
