"""``loss_normalization=tokens`` with a bfloat16 loss: the token counts (257..999, which bfloat16
cannot hold) are multiplied into the loss in float32, exactly, and the rounding autograd still does
at the entry of a bfloat16 graph is not silent (one warning)."""

import logging
from functools import partial

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from tests.support.helpers import run_trainer
from trainer import TrainModule
from trainer.precision import Precision

pytestmark = pytest.mark.timeout(120)
COUNTS = [257, 300, 513, 999]  # bfloat16 rounds 257 -> 256, 513 -> 512, 999 -> 1000


class TokenCounts(TrainModule):
    """One micro-batch per count; the loss is exactly 1.0 in ``dtype``, its token count is the batch's."""

    def __init__(self, dtype=torch.bfloat16):
        super().__init__(optimizer=partial(torch.optim.SGD, lr=0.0))
        self.p = nn.Parameter(torch.zeros(1))
        self.dtype = dtype

    def train_dataset(self):
        return TensorDataset(torch.tensor(COUNTS, dtype=torch.float64))

    def training_step(self, batch, batch_idx):
        loss = (self.p * 0 + 1).sum().to(self.dtype)
        return {"loss": loss, "num_tokens": batch[0].sum()}


def test_token_counts_are_multiplied_into_a_bf16_loss_exactly(tmp_path, monkeypatch, caplog):
    seen = []
    original = Precision.scale_loss

    def record(self, loss):
        seen.append((loss.dtype, loss.detach().double().item()))
        return original(self, loss)

    monkeypatch.setattr(Precision, "scale_loss", record)
    with caplog.at_level(logging.WARNING):
        run_trainer(tmp_path / "run", TokenCounts(), loss_normalization="tokens", batch_size=1, accumulate_grad_batches=4,
            max_steps=1)
    assert sorted(value for _, value in seen) == COUNTS  # not [256, 300, 512, 1000]
    assert {dtype for dtype, _ in seen} == {torch.float32}
    warnings = [r.getMessage() for r in caplog.records if "loss_normalization=tokens with a bfloat16 loss" in r.getMessage()]
    assert len(warnings) == 1 and "loss.float()" in warnings[0], caplog.text


def test_float32_loss_gives_exactly_token_weighted_gradient(tmp_path, monkeypatch):
    # The gradient of p is sum(count_i * 1) / sum(count_i) * dp = 1 exactly when the weights are exact;
    # with per-sample grads d_i = count_i / 1000 the weighted mean is checked to float32 precision.
    class Weighted(TokenCounts):
        def training_step(self, batch, batch_idx):
            loss = (self.p * (batch[0].float() / 1000)).sum()
            return {"loss": loss, "num_tokens": batch[0].sum()}

    grads = []
    monkeypatch.setattr(torch.optim.SGD, "step", lambda self, closure=None: grads.append(self.param_groups[0]["params"][0].grad.clone()))
    run_trainer(tmp_path / "run", Weighted(dtype=torch.float32), loss_normalization="tokens", batch_size=1,
        accumulate_grad_batches=4, max_steps=1, precision="bf16-mixed")
    counts = torch.tensor(COUNTS, dtype=torch.float64)
    expected = (counts * counts / 1000).sum() / counts.sum()
    assert grads and grads[0].item() == pytest.approx(expected.item(), rel=1e-6)
