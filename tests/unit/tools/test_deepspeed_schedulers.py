"""DeepSpeed's WarmupLR / WarmupDecayLR / WarmupCosineLR (trainer/deepspeed_config/schedulers.py) against
formulas transcribed from DeepSpeed 0.19.8's deepspeed/runtime/lr_schedules.py, at many optimizer steps.

DeepSpeed's scheduler sets the lr when built (its ``last_batch_iteration`` = -1) and is stepped after each
optimizer step, so optimizer step k (from 0) trains with the value at iteration k - 1. The check reads
the lr each optimizer step actually used (``param_groups[0]["lr"]`` before ``optimizer.step()``)."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.deepspeed_config.schedulers import WarmupCosineLR, WarmupDecayLR, WarmupLR

STEPS = 320  # past warm-up and past total_num_steps


# ----- transcribed from DeepSpeed (independent of the code under test) ---------------------------------------
def ds_warmup_gamma(it: int, warmup_num_steps: int, warmup_type: str) -> float:
    n = max(2, warmup_num_steps)
    if it < n:
        if warmup_type == "log":
            return (1.0 / math.log(n)) * math.log(it + 1)
        return it / n
    return 1.0


def ds_warmup_lr(it, min_lr=0.0, max_lr=0.001, warmup_num_steps=1000, warmup_type="log"):
    if it < 0:
        return min_lr
    return min_lr + ((max_lr - min_lr) * ds_warmup_gamma(it, warmup_num_steps, warmup_type))


def ds_warmup_decay_lr(it, total_num_steps, min_lr=0.0, max_lr=0.001, warmup_num_steps=1000, warmup_type="log"):
    if it < 0:
        return min_lr
    n = max(2, warmup_num_steps)
    if it < n:
        gamma = ds_warmup_gamma(it, warmup_num_steps, warmup_type)
    else:
        gamma = max(0.0, float(total_num_steps - it) / float(max(1.0, total_num_steps - n)))
    return min_lr + ((max_lr - min_lr) * gamma)


def ds_warmup_cosine_lr(it, org_lr, total_num_steps, warmup_min_ratio=0.0, warmup_num_steps=1000,
                        cos_min_ratio=0.0001, warmup_type="log"):
    if it < 0:
        return 0.0
    n = max(2, warmup_num_steps)
    if it < n:
        ratio = ds_warmup_gamma(it, warmup_num_steps, warmup_type)
        ratio = warmup_min_ratio + ratio * (1. - warmup_min_ratio)
    else:
        real_last_step = it - n + 1
        real_total_steps = max(1, total_num_steps - n)
        progress = min(1.0, real_last_step / real_total_steps)
        ratio = max(0.0, cos_min_ratio + (1. - cos_min_ratio) * ((1 + math.cos(math.pi * progress)) / 2))
    return org_lr * ratio


# ----- the check -----------------------------------------------------------------------------------------
def lrs_used(make_scheduler, lr: float = 0.05, steps: int = STEPS) -> list[float]:
    """The lr of each of ``steps`` optimizer steps, stepping the scheduler after each as the trainer does."""
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=lr)
    scheduler = make_scheduler(optimizer)
    used = []
    for _ in range(steps):
        used.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return used


def expected(formula, steps: int = STEPS) -> list[float]:
    return [formula(k - 1) for k in range(steps)]


@pytest.mark.parametrize("kwargs", [
    {},  # DeepSpeed's defaults: log warm-up over 1000 steps to the optimizer's lr
    {"warmup_min_lr": 0.0, "warmup_max_lr": 0.001, "warmup_num_steps": 100},  # zero2_fp16_adamw.json
    {"warmup_min_lr": 1e-4, "warmup_max_lr": 0.01, "warmup_num_steps": 50, "warmup_type": "linear"},
    {"warmup_num_steps": 1},  # used as 2
])
def test_warmup_lr(kwargs):
    max_lr = kwargs.get("warmup_max_lr", 0.05)  # None: the optimizer's lr (0.05)
    formula = lambda it: ds_warmup_lr(it, kwargs.get("warmup_min_lr", 0.0), max_lr,  # noqa: E731
                                      kwargs.get("warmup_num_steps", 1000), kwargs.get("warmup_type", "log"))
    assert lrs_used(lambda o: WarmupLR(o, **kwargs)) == expected(formula)


@pytest.mark.parametrize("kwargs", [
    {"total_num_steps": 300},  # defaults: warmup_max_lr 0.001 (not the optimizer's lr), log over 1000 > total
    {"total_num_steps": 300, "warmup_min_lr": 1e-5, "warmup_max_lr": 0.02, "warmup_num_steps": 40},
    {"total_num_steps": 250, "warmup_num_steps": 30, "warmup_type": "linear"},
])
def test_warmup_decay_lr(kwargs):
    formula = lambda it: ds_warmup_decay_lr(  # noqa: E731
        it, kwargs["total_num_steps"], kwargs.get("warmup_min_lr", 0.0), kwargs.get("warmup_max_lr", 0.001),
        kwargs.get("warmup_num_steps", 1000), kwargs.get("warmup_type", "log"))
    used = lrs_used(lambda o: WarmupDecayLR(o, **kwargs))
    assert used == expected(formula)
    if kwargs.get("warmup_num_steps", 1000) < kwargs["total_num_steps"] < STEPS:  # decayed to warmup_min_lr
        assert used[-1] == kwargs.get("warmup_min_lr", 0.0)


@pytest.mark.parametrize("kwargs", [
    {"total_num_steps": 300},  # defaults: log warm-up over 1000 steps, cos_min_ratio 1e-4
    {"total_num_steps": 300, "warmup_min_ratio": 0.1, "warmup_num_steps": 40, "cos_min_ratio": 0.01},
    {"total_num_steps": 200, "warmup_num_steps": 20, "warmup_type": "linear"},
])
def test_warmup_cosine_lr(kwargs):
    formula = lambda it: ds_warmup_cosine_lr(  # noqa: E731
        it, 0.05, kwargs["total_num_steps"], kwargs.get("warmup_min_ratio", 0.0), kwargs.get("warmup_num_steps", 1000),
        kwargs.get("cos_min_ratio", 0.0001), kwargs.get("warmup_type", "log"))
    used = lrs_used(lambda o: WarmupCosineLR(o, **kwargs))
    assert used == expected(formula)
    assert used[0] == 0.0  # DeepSpeed's first step trains with lr 0


def test_a_few_values_written_out():
    # A hand check that does not go through the transcription: log warm-up over 100 steps to 1e-3.
    used = lrs_used(lambda o: WarmupLR(o, warmup_max_lr=1e-3, warmup_num_steps=100), steps=102)
    assert used[:2] == [0.0, 0.0] and used[2] == pytest.approx(1e-3 * math.log(2) / math.log(100), rel=1e-12)
    assert used[101] == 1e-3


def test_state_survives_a_checkpoint():
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.05)
    scheduler = WarmupCosineLR(optimizer, total_num_steps=100, warmup_num_steps=10)
    for _ in range(37):
        optimizer.step()
        scheduler.step()
    resumed_optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.05)
    resumed = WarmupCosineLR(resumed_optimizer, total_num_steps=100, warmup_num_steps=10)
    resumed.load_state_dict(scheduler.state_dict())
    resumed.step(), scheduler.step()
    assert resumed_optimizer.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"] > 0


@pytest.mark.parametrize("make, message", [
    (lambda o: WarmupLR(o, warmup_num_steps=0), "warmup_num_steps must be a positive integer"),
    (lambda o: WarmupLR(o, warmup_type="exp"), "warmup_type='exp' (WarmupLR) is not one of log, linear"),
    (lambda o: WarmupDecayLR(o, total_num_steps=None), "total_num_steps must be an integer >= 1"),
    (lambda o: WarmupLR(o, warmup_min_lr=[0.0, 0.1]), "expected 1 values (one per param group), got 2"),
])
def test_bad_arguments_are_errors(make, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        make(torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1))
