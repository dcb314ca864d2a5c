"""The cnn recipe learns: trained in one process through the Trainer, it classifies the held-out
digits well. Measured with the recipe's settings (200 steps): 97.5-98.6% validation accuracy over
trainer seeds 0-5 (98.05% with seed 0, the one used here); the bar is 95%. Training takes 0.6 s
on an idle 2-core CPU, 3-4 s when other jobs load it."""

from __future__ import annotations

import functools

import pytest
import torch

from tests.support.helpers import read_metrics
from trainer.recipes.cnn import DigitsCNN, digits_split
from trainer import Trainer
from trainer.optim.schedules import warmup_cosine

pytestmark = pytest.mark.timeout(120)

STEPS = 200  # as conf/recipe/cnn.yaml
MIN_ACCURACY = 0.95


def recipe_module() -> DigitsCNN:
    """The module conf/recipe/cnn.yaml builds (SGD 0.1 / 0.9, warm-up 20 steps then cosine to 0.1x)."""
    return DigitsCNN(
        optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
        scheduler=functools.partial(warmup_cosine, warmup_steps=20, total_steps=STEPS, min_lr_ratio=0.1),
        width=16,
        val_fraction=0.2,
        data_seed=1234,
    )


def test_split_is_deterministic():
    train, val = digits_split(1234, 0.2)
    assert len(train) + len(val) == 1797 and len(val) == 359
    images, labels = train.tensors
    assert images.shape[1:] == (1, 8, 8) and 0.0 <= float(images.min()) and float(images.max()) <= 1.0
    assert set(labels.tolist()) == set(range(10))
    digits_split.cache_clear()
    again_train, again_val = digits_split(1234, 0.2)
    assert torch.equal(again_train.tensors[0], images) and torch.equal(again_val.tensors[1], val.tensors[1])
    other_train, _ = digits_split(1235, 0.2)
    assert not torch.equal(other_train.tensors[1], labels)  # another data_seed, another split


def test_recipe_reaches_high_validation_accuracy(tmp_path):
    result = Trainer(
        max_steps=STEPS, batch_size=32, log_every_n_steps=20, val_every_n_steps=100,
        loggers=["jsonl"], progress_bar=False, run_dir=str(tmp_path),
    ).fit(recipe_module())
    assert result["val/accuracy"] >= MIN_ACCURACY, result
    validations = [r for r in read_metrics(str(tmp_path)) if "val/accuracy" in r]
    assert len(validations) == 2  # at steps 100 and 200
    train_losses = [r["train/loss"] for r in read_metrics(str(tmp_path)) if "train/loss" in r]
    assert train_losses[-1] < 0.5 * train_losses[0]
