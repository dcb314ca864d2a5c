"""A small GAN on handwritten digits with manual optimization: ``python train.py recipe=gan``.

Two networks, two optimizers, stepped by ``training_step`` itself (``automatic_optimization =
False``, Lightning's manual optimization; see trainer/loop/manual_step.py). The data are
scikit-learn's 8x8 digits (no download). The latent noise comes with the data: each sample carries
its own ``z``, drawn once from ``noise_seed``, so the run does not depend on the world size (random
numbers drawn inside ``training_step`` would be each rank's own).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from trainer import TrainModule


@functools.lru_cache(maxsize=4)
def digits_with_noise(latent: int, noise_seed: int, num_samples: int | None = None) -> TensorDataset:
    """(image, z) pairs: the 1,797 digits as 64 values in [-1, 1] and a latent vector per sample."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as error:
        raise ImportError("recipe=gan needs scikit-learn (it ships the digits data): pip install scikit-learn") from error
    images = torch.as_tensor(load_digits().data, dtype=torch.float32) / 8.0 - 1.0  # pixel values are 0..16
    if num_samples is not None:
        images = images[:num_samples]
    z = torch.randn(len(images), latent, generator=torch.Generator().manual_seed(noise_seed))
    return TensorDataset(images, z)


class Generator(nn.Sequential):
    def __init__(self, latent: int, hidden: int):
        super().__init__(nn.Linear(latent, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden), nn.LeakyReLU(0.2),
                         nn.Linear(hidden, 64), nn.Tanh())


class Discriminator(nn.Sequential):
    def __init__(self, hidden: int):
        super().__init__(nn.Linear(64, hidden), nn.LeakyReLU(0.2), nn.Linear(hidden, hidden), nn.LeakyReLU(0.2),
                         nn.Linear(hidden, 1))


class DigitsGAN(TrainModule):
    """Generator (latent -> 64 pixels) and discriminator (64 pixels -> real/fake logit), trained in
    turn each step with their own optimizer; logs ``d_loss`` and ``g_loss``.

    Args:
        optimizer: factory for both optimizers (one instance each); the Hydra ``optimizer`` group.
        scheduler: optional factory, one scheduler per optimizer, stepped after each of its steps.
        latent: size of the noise vector.
        hidden: width of both networks.
        noise_seed: seeds every sample's noise vector.
        num_samples: use only the first ones of the 1,797 digits (None: all).
    """

    def __init__(self, optimizer=None, scheduler=None, latent: int = 16, hidden: int = 128, noise_seed: int = 1234,
                 num_samples: int | None = None):
        super().__init__(optimizer, scheduler)
        if latent < 1 or hidden < 1:
            raise ValueError(f"module.latent and module.hidden must be >= 1, got {latent} and {hidden}")
        self.automatic_optimization = False
        self.latent, self.hidden, self.noise_seed, self.num_samples = latent, hidden, noise_seed, num_samples
        self.generator: Generator | None = None
        self.discriminator: Discriminator | None = None

    def configure_model(self) -> None:
        if self.generator is None:  # built after the trainer seeded every rank alike
            self.generator = Generator(self.latent, self.hidden)
            self.discriminator = Discriminator(self.hidden)

    def block_classes(self):
        return (Generator, Discriminator)  # FSDP: each network its own unit

    def train_dataset(self):
        return digits_with_noise(self.latent, self.noise_seed, self.num_samples)

    def configure_optimizers(self):
        if self.optimizer_factory is None:
            raise ValueError("DigitsGAN needs optimizer=... (the Hydra optimizer group)")
        optimizers = [self.optimizer_factory(self.generator.parameters()),
                      self.optimizer_factory(self.discriminator.parameters())]
        if self.scheduler_factory is None:
            return optimizers
        return optimizers, [self.scheduler_factory(o) for o in optimizers]

    def training_step(self, batch, batch_idx):
        real, z = batch
        opt_g, opt_d = self.optimizers()
        schedulers = self.lr_schedulers()
        fake = self.generator(z)
        # Discriminator: real digits -> 1, generated -> 0 (the generator gets no gradient here).
        d_real, d_fake = self.discriminator(real), self.discriminator(fake.detach())
        d_loss = (F.binary_cross_entropy_with_logits(d_real, torch.ones_like(d_real))
                  + F.binary_cross_entropy_with_logits(d_fake, torch.zeros_like(d_fake)))
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        # Generator: make the discriminator say 1 on generated digits.
        d_on_fake = self.discriminator(fake)
        g_loss = F.binary_cross_entropy_with_logits(d_on_fake, torch.ones_like(d_on_fake))
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        if schedulers is not None:
            for scheduler in schedulers:
                scheduler.step()
        return {"d_loss": d_loss.detach(), "g_loss": g_loss.detach()}
