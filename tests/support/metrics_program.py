"""A Lightning program logging torchmetrics objects, in Lightning's documented idioms: Accuracy,
MeanMetric and SumMetric logged with on_step / on_epoch, a MetricCollection through log_dict, a
MaxMetric tracking the best validation accuracy, and a callback that logs from its batch hook and
reads ``trainer.callback_metrics`` there.

It runs as written under Lightning; tests/support/metrics_program_ours.py runs this same text with
its import line rewritten (tests/unit/api/test_logging_torchmetrics.py compares the two).
"""

import lightning.pytorch as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MaxMetric, MeanMetric, MetricCollection, SumMetric
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassPrecision

FEATURES, CLASSES = 6, 3


def make_data(num_samples, seed):
    """Fixed classification data, independent of the global RNG."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, FEATURES, generator=generator)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).long() + (x[:, 2] > 1).long()
    return x, y


class LitClassifier(L.LightningModule):
    def __init__(self, batch_size=8, train_samples=64, val_samples=32, track_best=True):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, CLASSES))
        self.train_acc = MulticlassAccuracy(num_classes=CLASSES, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes=CLASSES, average="micro")
        self.train_loss, self.val_loss = MeanMetric(), MeanMetric()
        self.val_count = SumMetric()
        self.val_acc_best = MaxMetric()
        self.test_acc = MulticlassAccuracy(num_classes=CLASSES, average="micro")
        self.val_metrics = MetricCollection({
            "f1": MulticlassF1Score(num_classes=CLASSES, average="macro"),
            "precision": MulticlassPrecision(num_classes=CLASSES, average="macro"),
        }, prefix="val/")

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y)
        self.train_loss(loss)
        self.train_acc(logits, y)
        self.log("train/loss", self.train_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.val_loss(F.cross_entropy(logits, y))
        self.val_acc(logits, y)
        self.val_count(torch.ones(len(y)))
        self.val_metrics(logits, y)
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("val/acc", self.val_acc, on_step=False, on_epoch=True, prog_bar=True)
        self.log("val/count", self.val_count)
        self.log_dict(self.val_metrics)

    def on_validation_epoch_end(self):
        if self.hparams.track_best:
            acc = self.val_acc.compute()
            self.val_acc_best(acc)
            self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True, prog_bar=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.test_acc(self(x), y)
        self.log("test/acc", self.test_acc)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)

    def train_dataloader(self):
        x, y = make_data(self.hparams.train_samples, seed=1)
        return DataLoader(TensorDataset(x, y), batch_size=self.hparams.batch_size, shuffle=False)

    def val_dataloader(self):
        x, y = make_data(self.hparams.val_samples, seed=2)
        return DataLoader(TensorDataset(x, y), batch_size=self.hparams.batch_size)

    def test_dataloader(self):
        x, y = make_data(self.hparams.val_samples, seed=3)
        return DataLoader(TensorDataset(x, y), batch_size=self.hparams.batch_size)


class BatchMetricsProbe(L.Callback):
    """Logs from its batch hook, and records what ``trainer.callback_metrics`` holds there."""

    def __init__(self):
        self.seen = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        pl_module.log("probe/loss", outputs["loss"] if isinstance(outputs, dict) else outputs)
        self.seen.append(float(trainer.callback_metrics["train/acc_step"]))
