"""Manual optimization against Lightning itself (one process, CPU): both GANs of
tests/support/lightning_gans.py compute the same losses and weights, ``toggle_optimizer`` /
``untoggle_optimizer`` / ``toggled_optimizer`` set the same ``requires_grad`` flags, and what
``self.optimizers()`` returns passes Lightning's own checks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.support.helpers import new_trainer
from tests.support.lightning_gans import GANData, ThreeCallGAN, ToggleGAN, make_gan_datamodule, make_three_call_gan, \
    make_toggle_gan
from trainer import TrainModule
from trainer.api.optimizer import LightningOptimizer

L = pytest.importorskip("lightning")
pytestmark = pytest.mark.timeout(300)


def lightning_fit(module, datamodule=None, max_steps: int = 30) -> None:
    L.Trainer(accelerator="cpu", devices=1, max_steps=max_steps, enable_progress_bar=False, logger=False,
              enable_checkpointing=False, enable_model_summary=False).fit(module, datamodule=datamodule)


def test_gans_compute_what_lightning_computes(tmp_path):
    theirs = make_three_call_gan(L.LightningModule)(num_samples=240)
    lightning_fit(theirs)
    ours = ThreeCallGAN(num_samples=240)
    new_trainer(tmp_path / "three", max_steps=30).fit(ours)
    assert len(ours.losses) == 15
    torch.testing.assert_close(torch.tensor(ours.losses), torch.tensor(theirs.losses), rtol=1e-5, atol=1e-5)
    for (name, mine), their in zip(ours.state_dict().items(), theirs.state_dict().values()):
        torch.testing.assert_close(mine, their, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")

    theirs = make_toggle_gan(L.LightningModule)()
    lightning_fit(theirs, make_gan_datamodule(L.LightningDataModule)(num_samples=240))
    ours = ToggleGAN()
    new_trainer(tmp_path / "toggle", max_steps=30).fit(ours, datamodule=GANData(num_samples=240))
    assert len(ours.losses) == 15 and ours.flags == theirs.flags == [(True, False)] * 15
    torch.testing.assert_close(torch.tensor(ours.losses), torch.tensor(theirs.losses), rtol=1e-5, atol=1e-5)
    assert len(ours.samples) == len(theirs.samples) == 1  # on_train_epoch_end's self(z)
    torch.testing.assert_close(ours.samples[0], theirs.samples[0], rtol=1e-5, atol=1e-5)


def make_flag_module(base: type) -> type:
    """Three optimizers' worth of parameters (one frozen by the user)
    and one in no optimizer; ``training_step`` records every flag around the toggles."""

    class Flags(base):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            torch.manual_seed(0)
            self.a, self.b, self.c, self.free = nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2), nn.Linear(2, 2)
            self.a.bias.requires_grad_(False)  # frozen by the user: toggling keeps it frozen
            self.seen: list = []

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 2)), batch_size=2)

        def configure_optimizers(self):
            return [torch.optim.SGD(self.a.parameters(), lr=0.1),
                    torch.optim.SGD([self.b.weight, self.c.weight], lr=0.1),
                    torch.optim.SGD([self.c.bias, self.b.bias], lr=0.1)]

        def flags(self):
            return [(name, p.requires_grad) for name, p in self.named_parameters()]

        def training_step(self, batch, batch_idx):
            opts = self.optimizers()
            for opt in opts:
                self.toggle_optimizer(opt)
                self.seen.append(("toggled", self.flags()))
                self.untoggle_optimizer(opt)
                self.seen.append(("untoggled", self.flags()))
            with self.toggled_optimizer(opts[1]):
                self.seen.append(("inside", self.flags()))
            self.seen.append(("after", self.flags()))
            (x,) = batch
            loss = sum(layer(x).sum() for layer in (self.a, self.b, self.c, self.free))
            opts[0].zero_grad()
            self.manual_backward(loss)
            opts[0].step()
            self.seen.append(("optimizers", all(isinstance(o, (torch.optim.SGD, LightningOptimizer)) for o in opts)))

    return Flags


def test_toggle_optimizer_sets_the_flags_lightning_sets(tmp_path):
    theirs = make_flag_module(L.LightningModule)()
    lightning_fit(theirs, max_steps=1)
    ours = make_flag_module(TrainModule)()
    new_trainer(tmp_path, max_steps=1).fit(ours)
    assert len(ours.seen) == 9 and ours.seen == theirs.seen
    assert ours.seen[-1] == ("optimizers", True)


def test_lightning_optimizer_is_an_instance_of_the_wrapped_class():
    from lightning.pytorch.core.optimizer import LightningOptimizer as TheirOptimizer

    model = nn.Linear(3, 1)
    inner = torch.optim.Adam(model.parameters(), lr=0.1)
    opt = LightningOptimizer(inner)
    assert isinstance(opt, torch.optim.Adam) and isinstance(opt, torch.optim.Optimizer) and isinstance(opt, LightningOptimizer)
    assert type(opt).__name__ == type(TheirOptimizer(inner)).__name__ == "LightningAdam"
    assert opt.optimizer is inner and opt.param_groups is inner.param_groups and opt.state is inner.state
    assert LightningOptimizer(opt).optimizer is inner  # wrapping a wrapper wraps the optimizer
    # step(closure): the optimizer calls it (LBFGS several times) and returns its loss, as Lightning's does
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    calls = []

    def closure():
        calls.append(1)
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        return loss

    before = model.weight.detach().clone()
    loss = opt.step(closure)
    assert len(calls) == 1 and isinstance(loss, torch.Tensor) and not torch.equal(before, model.weight)
    assert inner.state_dict()["state"][0]["step"] == 1 and opt.state_dict() == inner.state_dict()
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    lbfgs = LightningOptimizer(torch.optim.LBFGS(model.parameters(), max_iter=3))
    calls.clear()
    opt = lbfgs
    lbfgs.step(closure)
    assert isinstance(lbfgs, torch.optim.LBFGS) and len(calls) > 1
    with pytest.raises(TypeError, match="the closure must be callable"):
        lbfgs.step(closure=3)
    with pytest.raises(TypeError, match="wraps a torch.optim.Optimizer"):
        LightningOptimizer(model)
