"""A ``@rank_zero_only`` hook that runs the model (Lightning's autoencoder example samples images so at each
epoch's end) on 2 ranks: under FSDP the model's forward gathers its shards from every rank, and the other
ranks never call it. The run ends at once, naming the function, instead of waiting for the collective
timeout; where each rank holds the whole model (DDP, FSDP's ``no_shard``) the same hook runs on rank 0 alone."""

from __future__ import annotations

import os
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer.lightning import Callback, LightningModule, Trainer
from trainer.lightning.utilities import rank_zero_only
from trainer.runtime.launch import WorkerFailed
from trainer.strategies.fsdp import FSDPStrategy

pytestmark = pytest.mark.timeout(600)
COLLECTIVE_TIMEOUT_S = 240  # what rank 0 would wait before the fix: the test must end well before it


class Net(LightningModule):
    def __init__(self):
        super().__init__()
        self.encoder, self.decoder = nn.Linear(4, 8), nn.Linear(8, 4)

    def forward(self, x):
        return self.decoder(torch.relu(self.encoder(x)))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return nn.functional.mse_loss(self(x), x)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Sampler(Callback):
    """Runs the model on rank 0 only at each epoch's end and writes the output's shape to a file."""

    def __init__(self, path: str):
        self.path = path

    @rank_zero_only
    def on_train_epoch_end(self, trainer, pl_module):
        with torch.no_grad():
            out = pl_module(torch.zeros(3, 4))
        with open(self.path, "a") as f:
            f.write(f"{trainer.current_epoch} {tuple(out.shape)}\n")


def _fit(tmp_path, strategy) -> str:
    data = TensorDataset(torch.randn(16, 4, generator=torch.Generator().manual_seed(0)))
    path = str(tmp_path / "samples.txt")
    trainer = Trainer(devices=2, strategy=strategy, accelerator="cpu", max_epochs=2, callbacks=[Sampler(path)],
                      logger=False, enable_checkpointing=False, default_root_dir=str(tmp_path),
                      collective_timeout_s=COLLECTIVE_TIMEOUT_S)
    trainer.fit(Net(), DataLoader(data, batch_size=2))
    return path


def test_a_rank_zero_only_forward_of_an_fsdp_model_fails_at_once_naming_the_function(tmp_path):
    started = time.monotonic()
    with pytest.raises(WorkerFailed) as raised:
        _fit(tmp_path, "fsdp")
    elapsed = time.monotonic() - started
    message = str(raised.value)
    assert message.startswith("rank 0 failed: RuntimeError: Sampler.on_train_epoch_end runs on rank 0 only "
                              "(@rank_zero_only) and calls Net, whose parameters FSDP shards over 2 ranks"), message
    assert "strategy='ddp'" in message, message
    assert elapsed < COLLECTIVE_TIMEOUT_S / 2, elapsed
    assert not os.path.exists(tmp_path / "samples.txt")


@pytest.mark.parametrize("strategy", ["ddp", "fsdp no_shard"])
def test_where_each_rank_holds_the_whole_model_the_rank_zero_only_forward_runs_on_rank_zero_alone(tmp_path, strategy):
    path = _fit(tmp_path, "ddp" if strategy == "ddp" else FSDPStrategy(accelerator="cpu", sharding="no_shard"))
    with open(path) as f:
        assert f.read().splitlines() == ["0 (3, 4)", "1 (3, 4)"]
