"""Lightning's module paths and names that Lightning programs and tests import, each ours; a Lightning
module the mirror lacks is an ImportError that says what to use."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import trainer.lightning as L
from trainer.api.run_state import TrainerState


@pytest.mark.parametrize("path", [
    "trainer.lightning.trainer.trainer:Trainer", "trainer.lightning.trainer:Trainer",
    "trainer.lightning.trainer.states:TrainerFn", "trainer.lightning.trainer.states:RunningStage",
    "trainer.lightning.trainer.states:TrainerStatus", "trainer.lightning.trainer.states:TrainerState",
    "trainer.lightning.utilities.exceptions:MisconfigurationException",
    "trainer.lightning.fabric.utilities.exceptions:MisconfigurationException",
    "trainer.lightning.callbacks.prediction_writer:BasePredictionWriter",
    "trainer.lightning.callbacks:BasePredictionWriter", "trainer.lightning.cli:cli_lightning_logo",
])
def test_lightnings_module_paths_import(path):
    module, name = path.split(":")
    assert getattr(importlib.import_module(module), name) is not None


def test_the_names_are_ours_with_lightnings_values():
    lightning_states = pytest.importorskip("lightning.pytorch.trainer.states")
    from trainer.lightning.trainer import states
    from trainer.lightning.trainer.trainer import Trainer
    from trainer.lightning.utilities.exceptions import MisconfigurationException

    assert Trainer is L.Trainer and states.TrainerState is TrainerState
    for name in ("TrainerFn", "RunningStage", "TrainerStatus"):
        ours, theirs = getattr(states, name), getattr(lightning_states, name)
        assert {member.name: member.value for member in ours} == {member.name: member.value for member in theirs}
        assert all(member == member.value for member in ours)  # compares equal to the strings trainer.state holds
    assert issubclass(MisconfigurationException, ValueError)  # our refusals of a value keep their meaning
    with pytest.raises(MisconfigurationException, match="write_interval"):
        L.callbacks.BasePredictionWriter("sometimes")


def test_trainer_state_status_and_finished_as_lightnings(tmp_path):
    from trainer.lightning.trainer.states import TrainerFn, TrainerStatus

    module = _Tiny()
    trainer = L.Trainer(max_steps=1, enable_progress_bar=False, logger=False, enable_checkpointing=False,
                        default_root_dir=str(tmp_path))
    assert trainer.state.status == TrainerStatus.INITIALIZING and not trainer.state.finished
    trainer.fit(module)
    assert trainer.state.finished and trainer.state.stopped and trainer.state.fn == TrainerFn.FITTING
    assert trainer.state.status == TrainerStatus.FINISHED == "finished"


def test_a_lightning_module_the_mirror_lacks_says_what_to_use():
    with pytest.raises(ImportError, match=r"lightning\.pytorch\.tuner .*use Trainer\(auto_batch_size=True\)"):
        importlib.import_module("trainer.lightning.tuner")
    with pytest.raises(ImportError, match=r"lightning\.pytorch\.utilities\.memory .*use .*docs/lightning\.md"):
        importlib.import_module("trainer.lightning.utilities.memory")
    with pytest.raises(ImportError, match=r"cli\.instantiate_module .*use "):
        from trainer.lightning.cli import instantiate_module  # noqa: F401
    with pytest.raises(ModuleNotFoundError):  # other packages' missing modules are not its business
        importlib.import_module("trainer.no_such_module")


def test_cli_lightning_logo_prints_nothing(capsys):
    from trainer.lightning.cli import cli_lightning_logo

    cli_lightning_logo()
    assert capsys.readouterr() == ("", "")


def test_importing_the_mirror_sets_lightning_utilities_rank():
    pytest.importorskip("lightning_utilities")
    # A fresh interpreter: in this one, Lightning (imported by other tests) may have set it already.
    code = ("import trainer.lightning\nfrom lightning_utilities.core.rank_zero import rank_zero_only\n"
            "print(rank_zero_only.rank)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**_environment(), "RANK": "0"})
    assert out.stdout.strip() == "0"


def _environment() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE")}


class _Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def predict_step(self, batch, batch_idx):
        return self.layer(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)

    predict_dataloader = train_dataloader


def test_prediction_writer_writes_at_its_interval(tmp_path):
    written = []

    class Writer(L.callbacks.BasePredictionWriter):
        def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
            written.append(("batch", batch_idx, tuple(prediction.shape)))

        def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
            written.append(("epoch", [tuple(p.shape) for p in predictions], len(batch_indices[0])))

    for interval in ("batch", "epoch", "batch_and_epoch"):
        trainer = L.Trainer(enable_progress_bar=False, logger=False, default_root_dir=str(tmp_path),
                            callbacks=[Writer(interval)])
        trainer.predict(_Tiny(), return_predictions=False)
    batches = [("batch", 0, (4, 1)), ("batch", 1, (4, 1))]
    epoch = [("epoch", [(4, 1), (4, 1)], 2)]
    assert written == batches + epoch + batches + epoch
