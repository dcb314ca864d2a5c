"""Modules for tests/unit/loop/test_manual_optimization.py (importable by spawned workers)."""

from __future__ import annotations

from functools import partial

import torch

from trainer.recipes.gan import DigitsGAN


def tiny_gan(cls: type = DigitsGAN, **kwargs) -> DigitsGAN:
    """recipes/gan.py's module (or a subclass ``cls``), small: 197 digits (a short, uneven last global
    batch), width 16."""
    options = dict(optimizer=partial(torch.optim.Adam, lr=1e-3, betas=(0.5, 0.999)), latent=4, hidden=16,
                   num_samples=197)
    options.update(kwargs)
    return cls(**options)


class HandAccumulatingGAN(DigitsGAN):
    """Trains the discriminator only, on its micro-batch split in two halves accumulated by hand:
    the first half's backward inside ``no_backward_sync()`` when ``skip_sync`` (else synced too)."""

    def __init__(self, skip_sync: bool = True, **kwargs):
        super().__init__(optimizer=partial(torch.optim.SGD, lr=0.1), latent=4, hidden=16, num_samples=128, **kwargs)
        self.skip_sync = skip_sync

    def training_step(self, batch, batch_idx):
        real, z = batch
        _, opt_d = self.optimizers()
        opt_d.zero_grad()
        half = len(real) // 2
        losses = []
        for part, last in ((slice(0, half), False), (slice(half, None), True)):
            fake = self.generator(z[part]).detach()
            d_real, d_fake = self.discriminator(real[part]), self.discriminator(fake)
            loss = 0.5 * (torch.nn.functional.softplus(-d_real).mean() + torch.nn.functional.softplus(d_fake).mean())
            if not last and self.skip_sync:
                with self.no_backward_sync():
                    self.manual_backward(loss)
            else:
                self.manual_backward(loss)
            losses.append(loss.detach())
        opt_d.step()
        return {"d_loss": sum(losses)}


class OverflowingGAN(DigitsGAN):
    """The tiny GAN whose discriminator loss is infinite at ``bad_batch``: its fp16 step must be skipped."""

    def __init__(self, bad_batch: int = 2, **kwargs):
        super().__init__(optimizer=partial(torch.optim.SGD, lr=0.05), latent=4, hidden=16, num_samples=128, **kwargs)
        self.bad_batch = bad_batch
        self.seen: list[tuple[int, float]] = []  # (batch_idx, sum of the discriminator's weights after the step)

    def training_step(self, batch, batch_idx):
        real, z = batch
        opt_g, opt_d = self.optimizers()
        d_real = self.discriminator(real)
        d_loss = torch.nn.functional.softplus(-d_real).mean()
        if batch_idx == self.bad_batch:
            d_loss = d_loss * float("inf")
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        self.clip_gradients(opt_d, gradient_clip_val=1.0)
        opt_d.step()
        self.seen.append((batch_idx, sum(float(p.detach().sum()) for p in self.discriminator.parameters())))
        return {"d_loss": d_loss.detach()}


class CountingGAN(DigitsGAN):
    """The tiny GAN (two ``opt.step()`` per batch) that records ``self.global_step`` before and after
    its ``training_step`` and logs it reduced by min and max over the ranks (equal: every rank counts
    alike); its ``configure_optimizers`` reads ``trainer.estimated_stepping_batches`` (or the error)."""

    def __init__(self, **kwargs):
        options = dict(optimizer=partial(torch.optim.Adam, lr=1e-3, betas=(0.5, 0.999)), latent=4, hidden=16,
                       num_samples=197)
        options.update(kwargs)
        super().__init__(**options)
        self.seen: list[tuple[int, int]] = []
        self.estimated: int | str | None = None

    def configure_optimizers(self):
        try:
            self.estimated = self.trainer.estimated_stepping_batches
        except RuntimeError as error:
            self.estimated = str(error)
        return super().configure_optimizers()

    def training_step(self, batch, batch_idx):
        before = self.global_step
        output = super().training_step(batch, batch_idx)
        self.seen.append((before, self.global_step))
        for fx in ("min", "max"):
            self.log(f"global_step_{fx}", float(self.global_step), reduce_fx=fx)
        return output


class UnevenStepsGAN(HandAccumulatingGAN):
    """Rank ``extra_rank`` calls ``opt.step()`` once more per batch than the others (from batch
    ``from_batch`` on): the ranks' step counts part."""

    def __init__(self, extra_rank: int = 1, from_batch: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.extra_rank, self.from_batch = extra_rank, from_batch

    def training_step(self, batch, batch_idx):
        output = super().training_step(batch, batch_idx)
        if self.global_rank == self.extra_rank and batch_idx >= self.from_batch:
            self.optimizers()[1].step()
        return output


class StoppingGAN(HandAccumulatingGAN):
    """Sets ``trainer.should_stop = True`` on rank ``stop_rank`` only, after batch ``stop_batch``
    (a batch_idx); records each rank's last ``global_step`` in ``final_step_rank{r}.txt`` of ``out``."""

    def __init__(self, out: str, stop_rank: int = 1, stop_batch: int = 2, **kwargs):
        super().__init__(**kwargs)
        self.out, self.stop_rank, self.stop_batch = out, stop_rank, stop_batch

    def training_step(self, batch, batch_idx):
        output = super().training_step(batch, batch_idx)
        if self.global_rank == self.stop_rank and batch_idx == self.stop_batch:
            self.trainer.should_stop = True
        return output

    def on_train_end(self):
        with open(f"{self.out}/final_step_rank{self.global_rank}.txt", "w") as f:
            f.write(str(self.global_step))
