"""Two tiny GANs with manual optimization, written in Lightning's idioms, for
tests/unit/loop/test_manual_gans.py (importable by spawned workers).

Each is built on a base class given as an argument (``make_*(base)``: our ``TrainModule`` or
Lightning's ``LightningModule``), so the same code runs under both trainers. The latent noise comes
with the data (each sample carries its own ``z``), so the run does not depend on the world size.

- ``ThreeCallGAN``: the discriminator is called three times per step (real, ``fake.detach()`` for
  its own loss, ``fake`` for the generator's), two optimizers, data from ``train_dataloader``.
- ``ToggleGAN``: ``toggle_optimizer`` / ``untoggle_optimizer`` around each network's update, the
  generator called through ``self(z)``, data from a DataModule, and ``self(z)`` in epoch-end hooks.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

DATA_DIM, LATENT, HIDDEN = 8, 4, 16


def gan_data(num_samples: int = 256, seed: int = 7) -> TensorDataset:
    """(x, z): 8-dim "real" samples (a shifted, scaled Gaussian) and a latent vector for each."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, DATA_DIM, generator=generator) * 0.5 + 1.0
    z = torch.randn(num_samples, LATENT, generator=generator)
    return TensorDataset(x, z)


def _networks(seed: int) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(seed)  # the same weights under any trainer
    generator = nn.Sequential(nn.Linear(LATENT, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, DATA_DIM))
    discriminator = nn.Sequential(nn.Linear(DATA_DIM, HIDDEN), nn.LeakyReLU(0.2), nn.Linear(HIDDEN, 1))
    return generator, discriminator


def _named(cls: type, base: type) -> type:
    """``cls`` under a module-level name of this file (spawned workers unpickle it by name): the
    plain name on our base classes, prefixed by the base's name otherwise."""
    ours = base.__module__.startswith("trainer.")
    cls.__qualname__ = cls.__name__ = cls.__name__ if ours else f"{base.__name__}{cls.__name__}"
    cls.__module__ = __name__
    globals()[cls.__name__] = cls
    return cls


def make_three_call_gan(base: type) -> type:
    """The GAN whose discriminator is called three times per step, on ``base``."""

    class ThreeCallGAN(base):
        def __init__(self, batch_size: int = 16, lr: float = 0.01, num_samples: int = 256):
            super().__init__()
            self.automatic_optimization = False
            self.batch_size, self.lr, self.num_samples = batch_size, lr, num_samples
            self.generator, self.discriminator = _networks(0)
            self.losses: list[tuple[float, float]] = []

        def train_dataloader(self):
            return DataLoader(gan_data(self.num_samples), batch_size=self.batch_size, shuffle=False)

        def configure_optimizers(self):
            opt_g = torch.optim.Adam(self.generator.parameters(), lr=self.lr, betas=(0.5, 0.999))
            opt_d = torch.optim.SGD(self.discriminator.parameters(), lr=self.lr, momentum=0.9)
            return [opt_g, opt_d]

        def training_step(self, batch, batch_idx):
            x, z = batch
            opt_g, opt_d = self.optimizers()
            fake = self.generator(z)
            d_real = self.discriminator(x)
            d_fake = self.discriminator(fake.detach())
            d_loss = F.softplus(-d_real).mean() + F.softplus(d_fake).mean()
            opt_d.zero_grad()
            self.manual_backward(d_loss)
            opt_d.step()
            d_on_fake = self.discriminator(fake)
            g_loss = F.softplus(-d_on_fake).mean()
            opt_g.zero_grad()
            self.manual_backward(g_loss)
            opt_g.step()
            self.log("d_loss", d_loss)
            self.log("g_loss", g_loss)
            self.losses.append((float(d_loss.detach()), float(g_loss.detach())))  # this rank's micro-batch means

    return _named(ThreeCallGAN, base)


def make_gan_datamodule(base: type) -> type:
    """A DataModule of ``gan_data`` with ``setup`` and a train loader, on ``base``."""

    class GANData(base):
        def __init__(self, batch_size: int = 16, num_samples: int = 256):
            super().__init__()
            self.batch_size, self.num_samples = batch_size, num_samples

        def setup(self, stage):
            self.train_set = gan_data(self.num_samples)

        def train_dataloader(self):
            return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=False)

    return _named(GANData, base)


def make_toggle_gan(base: type) -> type:
    """The GAN that toggles each optimizer around its network's update, on ``base``."""

    class ToggleGAN(base):
        def __init__(self, lr: float = 0.01):
            super().__init__()
            self.automatic_optimization = False
            self.lr = lr
            self.generator, self.discriminator = _networks(1)
            self.losses: list[tuple[float, float]] = []
            self.samples: list[torch.Tensor] = []  # what self(z) gave in on_train_epoch_end
            self.flags: list[tuple[bool, bool]] = []  # (G, D) requires_grad while G was toggled

        def forward(self, z):
            return self.generator(z)

        def configure_optimizers(self):
            opt_g = torch.optim.Adam(self.generator.parameters(), lr=self.lr, betas=(0.5, 0.999))
            opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=self.lr, betas=(0.5, 0.999))
            return [opt_g, opt_d]

        def training_step(self, batch, batch_idx):
            x, z = batch
            opt_g, opt_d = self.optimizers()
            self.toggle_optimizer(opt_g)
            self.flags.append((all(p.requires_grad for p in self.generator.parameters()),
                               any(p.requires_grad for p in self.discriminator.parameters())))
            g_loss = F.softplus(-self.discriminator(self(z))).mean()
            self.manual_backward(g_loss)
            opt_g.step()
            opt_g.zero_grad()
            self.untoggle_optimizer(opt_g)
            self.toggle_optimizer(opt_d)
            d_loss = F.softplus(-self.discriminator(x)).mean() + F.softplus(self.discriminator(self(z).detach())).mean()
            self.manual_backward(d_loss)
            opt_d.step()
            opt_d.zero_grad()
            self.untoggle_optimizer(opt_d)
            self.log_dict({"g_loss": g_loss, "d_loss": d_loss})
            self.losses.append((float(d_loss.detach()), float(g_loss.detach())))

        def on_train_epoch_end(self):
            z = torch.linspace(-1, 1, 3 * LATENT, device=self.device).reshape(3, LATENT)
            with torch.no_grad():
                sample = self(z)
            self.samples.append(sample.detach().cpu())
            self.log("sample_mean", sample.mean())

    return _named(ToggleGAN, base)


def _ours() -> None:
    from trainer import DataModule, TrainModule

    make_three_call_gan(TrainModule)
    make_toggle_gan(TrainModule)
    make_gan_datamodule(DataModule)


_ours()  # ThreeCallGAN, ToggleGAN, GANData: on our base classes
ThreeCallGAN, ToggleGAN, GANData = globals()["ThreeCallGAN"], globals()["ToggleGAN"], globals()["GANData"]


class GradRecording:
    """Mixed into a GAN: at every ``opt.step()`` (an optimizer step pre-hook) records which of that
    optimizer's parameters have a gradient, and writes the list to ``<record_dir>/grads_rank<r>.json``
    at the end of the fit: ``[[optimizer index, [parameter names]], ...]``."""

    def __init__(self, record_dir: str, **kwargs):
        super().__init__(**kwargs)
        self.record_dir = record_dir
        self.grad_log: list = []
        self._hooked = False

    def training_step(self, batch, batch_idx):
        if not self._hooked:  # the optimizers exist now, and the parameters are those they step
            self._hooked = True
            names = {id(p): n for n, p in self.named_parameters()}
            for index, opt in enumerate(self.optimizers()):
                opt.optimizer.register_step_pre_hook(self._recorder(index, names))
        return super().training_step(batch, batch_idx)

    def _recorder(self, index: int, names: dict):
        def record(optimizer, args, kwargs):
            with_grad = [names[id(p)] for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
            self.grad_log.append([index, sorted(with_grad)])
        return record

    def on_fit_end(self):
        import json
        import os

        with open(os.path.join(self.record_dir, f"grads_rank{self.global_rank}.json"), "w") as f:
            json.dump(self.grad_log, f)


class RecordingThreeCallGAN(GradRecording, ThreeCallGAN):
    pass


class RecordingToggleGAN(GradRecording, ToggleGAN):
    pass


class EpochEndForward:
    """Mixed into a module with automatic optimization: ``on_train_epoch_end`` and
    ``on_validation_epoch_end`` call the module's own forward (``self(x)``) and log its mean."""

    def _forward_mean(self, name: str) -> None:
        x = torch.linspace(-1, 1, 12, device=self.device).reshape(2, 6)
        with torch.no_grad():
            self.log(name, self(x).mean())

    def on_train_epoch_end(self):
        self._forward_mean("train_end_forward")

    def on_validation_epoch_end(self):
        self._forward_mean("val_end_forward")


def _epoch_end_regressor() -> type:
    from tests.support.helpers import Regressor

    class EpochEndRegressor(EpochEndForward, Regressor):
        """tests/support/helpers.py's Regressor (automatic optimization, one ``nn.Sequential``: under
        FSDP the root holds its parameters) calling ``self(x)`` at each epoch end."""

    EpochEndRegressor.__module__, EpochEndRegressor.__qualname__ = __name__, "EpochEndRegressor"
    return EpochEndRegressor


EpochEndRegressor = _epoch_end_regressor()


def _own_parameter_gan() -> type:
    class OwnParameterGAN(ThreeCallGAN):
        """The three-call GAN with a parameter of the module itself (a learned output scale)."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.scale = nn.Parameter(torch.ones(()))

    OwnParameterGAN.__module__, OwnParameterGAN.__qualname__ = __name__, "OwnParameterGAN"
    return OwnParameterGAN


OwnParameterGAN = _own_parameter_gan()


def _stepping_inside_no_sync() -> type:
    class SteppingInsideNoSync(ThreeCallGAN):
        """Steps the discriminator inside ``no_backward_sync()`` (refused on any world size)."""

        def training_step(self, batch, batch_idx):
            x, z = batch
            opt_g, opt_d = self.optimizers()
            with self.no_backward_sync():
                self.manual_backward(F.softplus(-self.discriminator(x)).mean())
                opt_d.step()

    SteppingInsideNoSync.__module__, SteppingInsideNoSync.__qualname__ = __name__, "SteppingInsideNoSync"
    return SteppingInsideNoSync


SteppingInsideNoSync = _stepping_inside_no_sync()
