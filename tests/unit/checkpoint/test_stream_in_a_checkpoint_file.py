"""A checkpoint file saved mid-stream (``trainer.save_checkpoint(path)`` inside an epoch of a streaming
dataset) holds the stream position as one of its parts and resumes exactly where the uninterrupted run
was (one ``torch.save``: tests/unit/callbacks/test_lightning_checkpoint_writes.py); a write that fails is one
error naming the file, with nothing left beside it."""

from __future__ import annotations

import pytest
import torch

from tests.support.helpers import fit
from tests.support.stream_modules import StreamRegressor
from trainer.callbacks import Callback

pytestmark = pytest.mark.timeout(300)

STREAM = dict(strategy="single", devices=1, batch_size=8, num_workers=0, stream_mode="invariant")


class SaveAt(Callback):
    def __init__(self, step: int, path: str):
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def test_a_file_saved_mid_stream_resumes_exactly(tmp_path):
    _, reference = fit(tmp_path / "whole", StreamRegressor(), max_steps=18, **STREAM)
    path = str(tmp_path / "mid.ckpt")
    _, saving = fit(tmp_path / "first", StreamRegressor(), max_steps=18, callbacks=[SaveAt(9, path)], **STREAM)
    for name, value in reference.items():  # the save changed nothing of the training
        assert torch.equal(saving[name], value), name
    saved = torch.load(path, weights_only=True)["meshtrainer"]["objects"]
    assert saved["stream/rank-00000.pt"]["epoch_step"] > 0  # inside an epoch: a position to restore
    _, params = fit(tmp_path / "rest", StreamRegressor(), max_steps=18, resume=path, **STREAM)
    for name, value in reference.items():
        assert torch.equal(params[name], value), name


def test_a_failed_write_is_one_error_naming_the_file_and_leaves_nothing(tmp_path):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the checkpoint's folder should be")
    path = str(blocker / "mid.ckpt")
    with pytest.raises(Exception, match=r"checkpoint file .*mid.ckpt not saved \(.*Error"):
        fit(tmp_path / "run", StreamRegressor(), max_steps=4, callbacks=[SaveAt(2, path)], **STREAM)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not_a_folder", "run"]
