"""The short way of a quiet step (TrainStep.quiet_step) trains exactly as the whole way does: the same
parameters bit for bit, the same self.log values, and it is taken only where nothing it leaves out is set."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from trainer import Trainer, TrainModule
from trainer.loop import train_step
from trainer.strategies.base import TrainingStepForward

STEPS = 12


class _Logged(TrainModule):
    """Dropout (the random stream), a dict output with an extra metric, and self.log on step and epoch."""

    def __init__(self):
        super().__init__(optimizer=lambda params: torch.optim.AdamW(params, lr=0.01))
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))

    def train_dataset(self):
        generator = torch.Generator().manual_seed(0)
        return TensorDataset(torch.randn(64, 4, generator=generator), torch.randn(64, 1, generator=generator))

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        loss = torch.nn.functional.mse_loss(self.net(inputs), targets)
        self.log("mean_target", targets.mean(), on_step=False, on_epoch=True)
        return {"loss": loss, "abs_error": (self.net(inputs) - targets).abs().mean().detach()}


class _WithHook(_Logged):
    def on_before_backward(self, loss):
        self.seen = getattr(self, "seen", 0) + 1


def _fit(tmp_path, name, module, **settings):
    fit = Trainer(max_steps=STEPS, batch_size=8, loggers=[], progress_bar=False, checkpoint=None,
                  enable_model_summary=False, num_sanity_val_steps=0, run_dir=str(tmp_path / name),
                  **{"log_every_n_steps": 1000, **settings})
    fit.fit(module)
    return fit, [p.detach().clone() for p in module.parameters()]


@pytest.fixture
def short_ways(monkeypatch):
    """How many steps took the short way."""
    taken = []
    quiet_step = train_step.TrainStep.quiet_step

    def counted(self, plan, batches):
        taken.append(plan)
        return quiet_step(self, plan, batches)

    monkeypatch.setattr(train_step.TrainStep, "quiet_step", counted)
    return taken


def test_the_short_way_trains_bitwise_as_the_whole_way(tmp_path, short_ways):
    quiet_fit, quiet = _fit(tmp_path, "quiet", _Logged())
    # the first step counts FLOPs and the last one logs: the whole way; the rest: the short way
    assert len(short_ways) == STEPS - 2
    short_ways.clear()
    every_fit, every = _fit(tmp_path, "every", _Logged(), log_every_n_steps=1)  # every step logs: the whole way
    assert short_ways == []
    assert all(torch.equal(a, b) for a, b in zip(quiet, every))
    assert quiet_fit.callback_metrics["mean_target"] == every_fit.callback_metrics["mean_target"]
    assert quiet_fit.callback_metrics["train/loss"] == every_fit.callback_metrics["train/loss"]


def test_an_overridden_step_hook_keeps_every_step_on_the_whole_way(tmp_path, short_ways):
    module = _WithHook()
    _, hooked = _fit(tmp_path, "hooked", module)
    assert short_ways == [] and module.seen == STEPS
    _, plain = _fit(tmp_path, "plain", _Logged())
    assert all(torch.equal(a, b) for a, b in zip(hooked, plain))


@pytest.mark.parametrize("settings", [{"gradient_clip_val": 1.0}, {"accumulate_grad_batches": 2},
                                      {"profile": {"wall_clock_breakdown": True}}])
def test_what_the_short_way_leaves_out_sends_steps_the_whole_way(tmp_path, short_ways, settings):
    _fit(tmp_path, "set", _Logged(), **settings)
    assert short_ways == []


def test_a_global_module_hook_sees_the_strategys_wrapper_called(tmp_path, short_ways):
    called = []
    handle = torch.nn.modules.module.register_module_forward_pre_hook(
        lambda module, args: called.append(type(module)) if isinstance(module, TrainingStepForward) else None)
    try:
        _fit(tmp_path, "hooked", _Logged())
    finally:
        handle.remove()
    assert len(short_ways) == STEPS - 2
    assert called.count(TrainingStepForward) == STEPS  # the short way too calls the wrapper as a module


def test_the_wrapper_is_called_directly_only_when_nothing_would_see_the_call():
    wrapper = TrainingStepForward(torch.nn.Linear(1, 1))
    assert train_step._unhooked(wrapper)
    for register in (wrapper.register_forward_pre_hook, wrapper.register_forward_hook,
                     wrapper.register_full_backward_pre_hook, wrapper.register_full_backward_hook):
        handle = register(lambda *args: None)
        assert not train_step._unhooked(wrapper), register.__name__
        handle.remove()
        assert train_step._unhooked(wrapper)
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *args: None)
    assert not train_step._unhooked(wrapper)
    handle.remove()
    wrapper.compile()  # in place: nn.Module.__call__ runs the compiled forward
    assert not train_step._unhooked(wrapper)
