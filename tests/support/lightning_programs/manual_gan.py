"""A small GAN with manual optimization: two optimizers and two schedulers from
``configure_optimizers``, ``self.optimizers()`` / ``self.lr_schedulers()``, ``toggle_optimizer`` /
``untoggle_optimizer``, ``self.manual_backward``, the discriminator called three times per step, a
``training_step`` without ``batch_idx``, the module's own forward called from ``on_train_epoch_end``,
and a DataModule whose ``val_dataloader`` (``drop_last=True``) goes unused: the module has no
``validation_step``. The noise is part of each sample, so every run draws the same.
"""

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

LATENT = 3
GLOBAL_BATCH = 8


def ring_with_noise(samples, seed):
    generator = torch.Generator().manual_seed(seed)
    angle = 2 * torch.pi * torch.rand(samples, generator=generator)
    real = torch.stack([angle.cos(), angle.sin()], dim=1) + 0.05 * torch.randn(samples, 2, generator=generator)
    return TensorDataset(real, torch.randn(samples, LATENT, generator=generator))


class RingDataModule(L.LightningDataModule):
    def __init__(self, batch_size: int = GLOBAL_BATCH):
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self):
        return DataLoader(ring_with_noise(16, seed=1), batch_size=self.hparams.batch_size, shuffle=False)

    def val_dataloader(self):
        return DataLoader(ring_with_noise(10, seed=2), batch_size=self.hparams.batch_size, drop_last=True)

    def predict_dataloader(self):
        return DataLoader(ring_with_noise(8, seed=3), batch_size=self.hparams.batch_size)


class RingGAN(L.LightningModule):
    def __init__(self, lr: float = 0.01):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(LATENT, 16), nn.ReLU(), nn.Linear(16, 2))
        self.discriminator = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
        self.batches_started = 0
        self.register_buffer("fixed_noise", torch.linspace(-1.0, 1.0, 4 * LATENT).reshape(4, LATENT))

    def forward(self, z):
        return self.generator(z)

    def training_step(self, batch):
        real, z = batch
        opt_g, opt_d = self.optimizers()
        ones, zeros = torch.ones(real.shape[0], 1), torch.zeros(real.shape[0], 1)

        self.toggle_optimizer(opt_d)
        fake = self(z).detach()
        d_loss = (F.binary_cross_entropy_with_logits(self.discriminator(real), ones)
                  + F.binary_cross_entropy_with_logits(self.discriminator(fake), zeros)) / 2
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        self.untoggle_optimizer(opt_d)

        self.toggle_optimizer(opt_g)
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self(z)), ones)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        self.untoggle_optimizer(opt_g)

        self.log_dict({"g_loss": g_loss, "d_loss": d_loss}, prog_bar=True)

    def on_train_epoch_end(self):
        for scheduler in self.lr_schedulers():
            scheduler.step()
        with torch.no_grad():
            samples = self(self.fixed_noise)
        self.log("sample_radius", samples.norm(dim=1).mean())

    def on_train_batch_start(self, batch, batch_idx):
        self.batches_started += 1

    def predict_step(self, batch, batch_idx):
        _, z = batch
        return self(z)

    def configure_optimizers(self):
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=self.hparams.lr, betas=(0.5, 0.999))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=self.hparams.lr, betas=(0.5, 0.999))
        schedulers = [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7) for opt in (opt_g, opt_d)]
        return [opt_g, opt_d], schedulers


def main(root_dir, devices=1, strategy="auto", callbacks=(), instrument=lambda obj: obj):
    """Fit two epochs, then predict samples from each predict batch's noise."""
    L.seed_everything(2)
    datamodule = instrument(RingDataModule(batch_size=GLOBAL_BATCH // devices))
    model = instrument(RingGAN())
    trainer = L.Trainer(
        default_root_dir=root_dir, accelerator="cpu", devices=devices, strategy=strategy, max_epochs=2,
        logger=False, enable_progress_bar=False, enable_model_summary=False, callbacks=list(callbacks),
    )
    trainer.fit(model, datamodule)
    return {
        "model": model,
        "fit": dict(trainer.callback_metrics),
        "predict": trainer.predict(model, datamodule=datamodule),
    }
