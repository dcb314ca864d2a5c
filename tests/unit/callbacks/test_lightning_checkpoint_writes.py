"""How the mirror's ModelCheckpoint writes a Lightning checkpoint file, as Lightning does: one ``torch.save``
per file (under a temporary name, renamed over the file), the callback's ``state_dict()`` once per
save, no folder left beside the file; and a file written before the small parts were kept as values
(every part as bytes) still resumes. 2 ranks: tests/multiprocess/api/test_lightning_checkpoint_writes_ranks.py."""

from __future__ import annotations

import io
import os

import pytest
import torch

from tests.unit.callbacks.test_lightning_checkpoint_files import Module, files, ours
from trainer.lightning.callbacks import Callback, ModelCheckpoint

pytestmark = pytest.mark.timeout(300)


class CountingCheckpoint(ModelCheckpoint):
    """Counts its ``state_dict()`` calls; returns nothing from it, as Lightning's own test's subclass does."""

    def __init__(self, **settings):
        super().__init__(**settings)
        self.state_dict_calls = 0

    def state_dict(self):
        super().state_dict()
        self.state_dict_calls += 1


class RecordSaves(Callback):
    """Records every ``torch.save`` target from the start of training (Lightning's test patches it there)."""

    def __init__(self, monkeypatch):
        self.monkeypatch, self.targets = monkeypatch, []

    def on_train_start(self, trainer, pl_module):
        real = torch.save

        def save(obj, f, *args, **kwargs):
            self.targets.append(os.fspath(f) if isinstance(f, (str, os.PathLike)) else type(f).__name__)
            return real(obj, f, *args, **kwargs)

        self.monkeypatch.setattr(torch, "save", save)


def test_each_file_is_one_torch_save_and_one_state_dict_call(tmp_path, monkeypatch):
    callback = CountingCheckpoint(dirpath=str(tmp_path / "ckpt"), monitor="val_loss", save_top_k=-1, save_last=True)
    saves = RecordSaves(monkeypatch)
    ours(tmp_path, [callback, saves], max_epochs=3)
    monkeypatch.undo()
    names = [f"epoch={e}-step={2 * (e + 1)}.ckpt" for e in range(3)]
    assert files(tmp_path / "ckpt") == sorted(names + ["last.ckpt"])
    # each save: the file's content under a temporary name beside it, renamed over it
    written = [name for e in range(3) for name in (names[e], "last.ckpt")]
    assert [os.path.dirname(target) for target in saves.targets] == [str(tmp_path / "ckpt")] * 6
    assert [os.path.basename(target).rsplit(".tmp-", 1)[0] for target in saves.targets] == [f".{n}" for n in written]
    assert callback.state_dict_calls == 6
    # the callback's state_dict returned nothing: the files hold no state for it (Lightning keeps none)
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert callback.state_key not in saved["callbacks"]


def _as_bytes(value) -> torch.Tensor:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def test_a_file_with_every_part_as_bytes_still_resumes(tmp_path):
    whole = Module()
    ours(tmp_path / "whole", [ModelCheckpoint(dirpath=str(tmp_path / "w"))], max_epochs=4, module=whole)
    first = ModelCheckpoint(dirpath=str(tmp_path / "half"), save_last=True)
    ours(tmp_path / "a", [first], max_epochs=2)
    checkpoint = torch.load(first.last_model_path, weights_only=True)
    resume = checkpoint["meshtrainer"]
    assert {"extras.pt", "rng/rank-00000.pt"} <= set(resume["objects"])
    resume["files"].update({name: _as_bytes(value) for name, value in resume.pop("objects").items()})
    older = str(tmp_path / "older.ckpt")
    torch.save(checkpoint, older)
    resumed = Module()
    ours(tmp_path / "b", [ModelCheckpoint(dirpath=str(tmp_path / "rest"))], max_epochs=4, module=resumed,
         ckpt_path=older)
    for name, value in resumed.state_dict().items():
        torch.testing.assert_close(value, whole.state_dict()[name], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("step", [3, 2])  # inside the second epoch; the first epoch's last batch
def test_a_file_saved_in_on_train_batch_end_resumes_as_the_uninterrupted_run(tmp_path, step):
    """``every_n_train_steps`` saves in ``on_train_batch_end``, after the batch's optimizer step: the file
    says that batch is trained, and a resume goes on from the next one."""
    whole = Module()
    ours(tmp_path / "whole", [], max_epochs=4, module=whole)
    callback = ModelCheckpoint(dirpath=str(tmp_path / "c"), every_n_train_steps=step, save_top_k=-1, filename="{step}")
    ours(tmp_path / "a", [callback], max_epochs=4)
    saved = torch.load(tmp_path / "c" / f"step={step}.ckpt", weights_only=True)
    assert saved["global_step"] == step
    resumed = Module()
    trainer = ours(tmp_path / "b", [], max_epochs=4, module=resumed, ckpt_path=str(tmp_path / "c" / f"step={step}.ckpt"))
    assert trainer.global_step == 8
    for name, value in resumed.state_dict().items():
        torch.testing.assert_close(value, whole.state_dict()[name], rtol=1e-6, atol=1e-7)


class Manual(Module):
    """The same training under manual optimization (one ``opt.step()`` a batch)."""

    def __init__(self, width: int = 4):
        super().__init__(width)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()


def test_under_manual_optimization_a_file_saved_in_on_train_batch_end_resumes_too(tmp_path):
    whole = Manual()
    ours(tmp_path / "whole", [], max_epochs=4, module=whole)
    callback = ModelCheckpoint(dirpath=str(tmp_path / "c"), every_n_train_steps=3, save_top_k=-1, filename="{step}")
    ours(tmp_path / "a", [callback], max_epochs=4, module=Manual())
    resumed = Manual()
    trainer = ours(tmp_path / "b", [], max_epochs=4, module=resumed, ckpt_path=str(tmp_path / "c" / "step=3.ckpt"))
    assert trainer.global_step == 8
    for name, value in resumed.state_dict().items():
        torch.testing.assert_close(value, whole.state_dict()[name], rtol=1e-6, atol=1e-7)
