"""A classifier in the lightning-hydra-template manner: torchmetrics objects for loss and accuracy logged
with ``on_epoch=True``, the best validation accuracy tracked with a ``MaxMetric`` (``val/acc_best``),
the validation metrics reset in ``on_train_start`` (the sanity check must not count), and a
DataModule serving train / val / test / predict data.
"""

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification import Accuracy

FEATURES, CLASSES = 8, 3
GLOBAL_BATCH = 8
SAMPLES = 16  # every split: two batches of 8 (of 4 on each of 2 ranks)


def labelled_points(seed):
    """Points labelled by a fixed linear teacher (the argmax of three scores), with a few labels flipped."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    teacher = torch.linspace(-1.0, 1.0, FEATURES * CLASSES).reshape(FEATURES, CLASSES)
    y = (x @ teacher).argmax(dim=1)
    flipped = torch.arange(SAMPLES) % 5 == 0
    y[flipped] = (y[flipped] + 1) % CLASSES
    return x, y


class PointsDataModule(L.LightningDataModule):
    def __init__(self, batch_size: int = GLOBAL_BATCH):
        super().__init__()
        self.save_hyperparameters()
        self.splits = {}

    def setup(self, stage=None):
        if not self.splits:
            for seed, split in enumerate(("train", "val", "test", "predict"), start=11):
                self.splits[split] = TensorDataset(*labelled_points(seed))

    def _loader(self, split):
        return DataLoader(self.splits[split], batch_size=self.hparams.batch_size, shuffle=False)

    def train_dataloader(self):
        return self._loader("train")

    def val_dataloader(self):
        return self._loader("val")

    def test_dataloader(self):
        return self._loader("test")

    def predict_dataloader(self):
        return self._loader("predict")


class PointsClassifier(L.LightningModule):
    def __init__(self, hidden: int = 16, lr: float = 1.0):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES))
        self.train_acc = Accuracy(task="multiclass", num_classes=CLASSES)
        self.val_acc = Accuracy(task="multiclass", num_classes=CLASSES)
        self.test_acc = Accuracy(task="multiclass", num_classes=CLASSES)
        self.train_loss, self.val_loss, self.test_loss = MeanMetric(), MeanMetric(), MeanMetric()
        self.val_acc_best = MaxMetric()

    def forward(self, x):
        return self.net(x)

    def on_train_start(self):
        # the sanity check's validation batches must not count towards the first epoch's metrics
        self.val_loss.reset()
        self.val_acc.reset()
        self.val_acc_best.reset()

    def shared_step(self, batch):
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits, y), logits.argmax(dim=1), y

    def training_step(self, batch, batch_idx):
        loss, predictions, targets = self.shared_step(batch)
        self.train_loss(loss)
        self.train_acc(predictions, targets)
        self.log("train/loss", self.train_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        loss, predictions, targets = self.shared_step(batch)
        self.val_loss(loss)
        self.val_acc(predictions, targets)
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("val/acc", self.val_acc, on_step=False, on_epoch=True, prog_bar=True)

    def on_validation_epoch_end(self):
        self.val_acc_best(self.val_acc.compute())
        self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True, prog_bar=True)

    def test_step(self, batch, batch_idx):
        loss, predictions, targets = self.shared_step(batch)
        self.test_loss(loss)
        self.test_acc(predictions, targets)
        self.log("test/loss", self.test_loss, on_step=False, on_epoch=True)
        self.log("test/acc", self.test_acc, on_step=False, on_epoch=True)

    def predict_step(self, batch, batch_idx):
        x, _ = batch
        return self(x).softmax(dim=1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def main(root_dir, devices=1, strategy="auto", callbacks=(), instrument=lambda obj: obj, max_epochs=2):
    """Fit, then validate / test / predict with the fitted module; returns what each gave."""
    L.seed_everything(7)
    datamodule = instrument(PointsDataModule(batch_size=GLOBAL_BATCH // devices))
    model = instrument(PointsClassifier())
    trainer = L.Trainer(
        default_root_dir=root_dir, accelerator="cpu", devices=devices, strategy=strategy, max_epochs=max_epochs,
        num_sanity_val_steps=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=list(callbacks),
    )
    trainer.fit(model, datamodule=datamodule)
    return {
        "model": model,
        "fit": dict(trainer.callback_metrics),
        "validate": trainer.validate(model, datamodule=datamodule),
        "test": trainer.test(model, datamodule=datamodule),
        "predict": trainer.predict(model, datamodule=datamodule),
    }
