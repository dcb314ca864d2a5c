"""The hooks that replace what the trainer does (``optimizer_step`` with its closure,
``optimizer_zero_grad``, ``configure_gradient_clipping`` with ``self.clip_gradients``,
``lr_scheduler_step``, ``backward``, the batch transfer hooks) compute what they compute under
Lightning itself: one program, run under both on one process with the same data order, gives the
same losses and weights (1e-6); and ``on_exception`` / ``on_train_batch_start`` returning -1."""

from __future__ import annotations

import types

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

lightning = pytest.importorskip("lightning.pytorch", reason="Lightning (a dev dependency) is the oracle")

SAMPLES, BATCH, ACCUMULATE = 24, 4, 2


def _data():
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(SAMPLES, 3, generator=generator)
    return TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.1 * torch.randn(SAMPLES, 1, generator=generator))


def program(base: type) -> type:
    """A module overriding every behaviour hook, written once for Lightning's base class and ours."""

    class Module(base):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(3, 1)
            self.losses, self.scheduler_steps, self.zeroed = [], 0, 0

        def forward(self, x):
            return self.layer(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self(x), y)
            self.losses.append(loss.item())
            return loss

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.2, momentum=0.5)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 2, 0.5),
                                                             "interval": "step"}}

        def train_dataloader(self):
            return DataLoader(_data(), batch_size=BATCH)

        def on_after_batch_transfer(self, batch, dataloader_idx):
            x, y = batch
            return x * 0.5, y  # used by the step: changes the weights if ignored

        def backward(self, loss, *args, **kwargs):
            (loss * 2.0).backward()  # used: doubles every gradient

        def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
            self.zeroed += 1
            optimizer.zero_grad()

        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
            warmup = min(1.0, (self.global_step + 1) / 3)  # a hand warm-up on top of the scheduler
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] * warmup
            optimizer.step(closure=optimizer_closure)
            for group in optimizer.param_groups:
                group["lr"] = group["lr"] / warmup

        def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
            self.clip_gradients(optimizer, gradient_clip_val=0.3, gradient_clip_algorithm="value")

        def lr_scheduler_step(self, scheduler, metric):
            self.scheduler_steps += 1
            scheduler.step()

    return Module


def _weights(module):
    return torch.cat([p.detach().flatten() for p in module.parameters()])


def test_behaviour_hooks_train_as_under_lightning(tmp_path):
    from trainer import TrainModule, Trainer

    reference = program(lightning.LightningModule)()
    lightning.Trainer(accelerator="cpu", devices=1, max_epochs=2, enable_progress_bar=False, logger=False,
                      enable_checkpointing=False, enable_model_summary=False, accumulate_grad_batches=ACCUMULATE,
                      default_root_dir=str(tmp_path / "lightning"), num_sanity_val_steps=0).fit(reference)
    ours = program(TrainModule)()
    Trainer(max_epochs=2, progress_bar=False, loggers=[], enable_model_summary=False, batch_size=BATCH,
            accumulate_grad_batches=ACCUMULATE, run_dir=str(tmp_path / "ours")).fit(ours)
    assert ours.losses == pytest.approx(reference.losses, rel=1e-6)
    assert torch.allclose(_weights(ours), _weights(reference), rtol=1e-6, atol=1e-7)
    steps = 2 * SAMPLES // (BATCH * ACCUMULATE)
    assert ours.scheduler_steps == reference.scheduler_steps == steps
    assert ours.zeroed == reference.zeroed == steps
    plain = program(TrainModule)()  # the hooks matter: without them the weights differ
    for name in ("on_after_batch_transfer", "backward", "optimizer_step", "configure_gradient_clipping"):
        setattr(plain, name, types.MethodType(getattr(TrainModule, name), plain))
    Trainer(max_epochs=2, progress_bar=False, loggers=[], enable_model_summary=False, batch_size=BATCH,
            accumulate_grad_batches=ACCUMULATE, run_dir=str(tmp_path / "plain")).fit(plain)
    assert not torch.allclose(_weights(plain), _weights(ours), rtol=1e-3)


def test_an_optimizer_step_that_never_calls_the_closure_is_an_error(tmp_path):
    from trainer import TrainModule, Trainer

    class Skipping(program(TrainModule)):
        def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
            pass

    with pytest.raises(RuntimeError, match="optimizer_step did not call optimizer_closure"):
        Trainer(max_steps=1, progress_bar=False, loggers=[], batch_size=BATCH, run_dir=str(tmp_path)).fit(Skipping())


def test_on_exception_gets_the_error_and_it_is_raised(tmp_path):
    from trainer import TrainModule, Trainer
    from trainer.api.callback import Callback

    class Failing(program(TrainModule)):
        def training_step(self, batch, batch_idx):
            raise ValueError("broken step")

    class Seen(Callback):
        errors: list = []

        def on_exception(self, trainer, module, exception):
            self.errors.append(exception)

    seen = Seen()
    with pytest.raises(ValueError, match="broken step"):
        Trainer(max_steps=1, progress_bar=False, loggers=[], batch_size=BATCH, run_dir=str(tmp_path),
                callbacks=[seen]).fit(Failing())
    assert [str(error) for error in seen.errors] == ["broken step"]


def test_minus_one_on_every_batch_trains_nothing_and_ends_each_epoch(tmp_path):
    from trainer import TrainModule, Trainer

    class Skips(program(TrainModule)):
        epoch_ends = 0

        def on_train_batch_start(self, batch, batch_idx):
            return -1

        def on_train_epoch_end(self):
            self.epoch_ends += 1

    module = Skips()
    before = [p.detach().clone() for p in module.parameters()]
    trainer = Trainer(max_epochs=3, progress_bar=False, loggers=[], batch_size=BATCH, run_dir=str(tmp_path))
    trainer.fit(module)
    assert trainer.global_step == 0 and trainer.current_epoch == 3 and module.epoch_ends == 3
    assert all(torch.equal(a, b) for a, b in zip(before, module.parameters()))


def test_steps_without_batch_idx_are_called_with_the_batch_alone(tmp_path):
    from trainer import TrainModule, Trainer

    class NoIndex(TrainModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

        def predict_step(self, batch):
            return self.layer(batch[0])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return DataLoader(_data(), batch_size=BATCH)

        val_dataloader = predict_dataloader = train_dataloader

    trainer = Trainer(max_steps=2, progress_bar=False, loggers=[], run_dir=str(tmp_path), check_val_every_n_epoch=1)
    module = NoIndex()
    trainer.fit(module)
    assert "val_loss" in trainer.callback_metrics
    assert len(trainer.predict(module)) == SAMPLES // BATCH


class _ClipsWithTheTrainersValue:
    """``self.clip_gradients`` leaving out the value: the Trainer's ``gradient_clip_val`` is used."""

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.clip_gradients(optimizer, gradient_clip_algorithm="value")


def test_clip_gradients_takes_the_trainers_value_as_lightning(tmp_path):
    from trainer import TrainModule, Trainer

    reference = type("Reference", (_ClipsWithTheTrainersValue, program(lightning.LightningModule)), {})()
    lightning.Trainer(accelerator="cpu", devices=1, max_epochs=1, enable_progress_bar=False, logger=False,
                      enable_checkpointing=False, enable_model_summary=False, gradient_clip_val=0.05,
                      default_root_dir=str(tmp_path / "lightning"), num_sanity_val_steps=0).fit(reference)
    ours = type("Ours", (_ClipsWithTheTrainersValue, program(TrainModule)), {})()
    Trainer(max_epochs=1, progress_bar=False, loggers=[], enable_model_summary=False, batch_size=BATCH,
            gradient_clip_val=0.05, run_dir=str(tmp_path / "ours")).fit(ours)
    assert torch.allclose(_weights(ours), _weights(reference), rtol=1e-6, atol=1e-7)
    unclipped = program(TrainModule)()  # (clipped at 0.3 by its own hook: the value used matters)
    Trainer(max_epochs=1, progress_bar=False, loggers=[], enable_model_summary=False, batch_size=BATCH,
            run_dir=str(tmp_path / "other")).fit(unclipped)
    assert not torch.allclose(_weights(unclipped), _weights(ours), rtol=1e-3)


def test_clip_gradients_with_another_value_than_the_trainers_is_lightnings_error(tmp_path):
    from trainer import TrainModule, Trainer
    from trainer.lightning.utilities.exceptions import MisconfigurationException

    with pytest.raises(MisconfigurationException, match=r"gradient_clip_val=0.05\)` and have passed `clip_gradients"):
        Trainer(max_steps=1, progress_bar=False, loggers=[], batch_size=BATCH, gradient_clip_val=0.05,
                run_dir=str(tmp_path)).fit(program(TrainModule)())
