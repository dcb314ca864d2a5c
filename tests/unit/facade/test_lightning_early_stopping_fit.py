"""The Lightning mirror's ``EarlyStopping`` in a fit, against Lightning itself on the same program:
where it checks when ``check_on_train_epoch_end`` is left unset (a training metric, no validation),
``stopped_epoch``, and ``trainer.should_stop`` after the fit."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset


def _program(pl, values):
    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            self.log("foo", values[self.current_epoch], on_step=False, on_epoch=True)
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return DataLoader(TensorDataset(torch.ones(4, 2)), batch_size=2)

    return Module()


def _fit(pl, callbacks_module, tmp_path, values):
    stopping = callbacks_module.EarlyStopping("foo", patience=1)
    trainer = pl.Trainer(default_root_dir=str(tmp_path), max_epochs=len(values), limit_val_batches=0, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[stopping])
    trainer.fit(_program(pl, values))
    return stopping.stopped_epoch, trainer.current_epoch, trainer.global_step, trainer.should_stop


@pytest.mark.parametrize("values", [[3.0, 2.0, 2.5, 1.0, 0.5], [3.0, 2.0, 1.0]])
def test_a_training_metric_stops_where_lightning_stops(tmp_path, values):
    lightning = pytest.importorskip("lightning.pytorch")
    import trainer.lightning as mirror
    from trainer.lightning import callbacks

    theirs = _fit(lightning, lightning.callbacks, tmp_path / "lightning", values)
    ours = _fit(mirror, callbacks, tmp_path / "mirror", values)
    assert ours == theirs
    assert ours[3] == (values == [3.0, 2.0, 2.5, 1.0, 0.5])  # the first run stops, the second does not
