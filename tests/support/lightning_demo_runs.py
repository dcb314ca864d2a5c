"""Runs Lightning's demo modules (tests/support/lightning_demos/, imports rewritten only) through
fit / validate / test / predict on one strategy, and returns what each call gave.

``run_all(strategy, root)`` runs every case in this process: in the test process for "single",
in each of 2 ranks started once by ``run_ranks`` for "ddp" and "fsdp" (all cases share those two
processes and one process group, so 2-rank runs cost no process start each). A case's failure is
caught and returned as its result (``{"error": ...}``), so one demo failing does not hide the others.

The downloads are replaced by small local files, written by ``write_fake_downloads(root)`` where
the demos look for them: ``<root>/data/wikitext-2.txt`` (WikiText2, read from the working
directory's ``./data``) and ``<root>/mnist/MNIST/complete/{training,test}.pt`` (MNIST with
``PL_USE_MOCKED_MNIST=1``).
"""

from __future__ import annotations

import os
import pickle
import traceback
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

import trainer.lightning as L
from tests.support.lightning_demos.boring_classes import BoringModel, RandomDataset

WORDS = 37  # the fake WikiText2's vocabulary: small, so the demos' embeddings and decoders stay small
MNIST_TRAIN, MNIST_TEST, MNIST_VAL_SPLIT, MNIST_BATCH = 48, 24, 16, 4


def write_fake_downloads(root: str) -> None:
    """The demos' downloads, as tiny local files (a fixed generator: the same files every time)."""
    generator = torch.Generator().manual_seed(11)
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    words = [f"w{i}" for i in range(WORDS - 1)]  # + "<eos>" the tokenizer adds
    with open(os.path.join(root, "data", "wikitext-2.txt"), "w", encoding="utf-8") as f:
        for _ in range(200):  # 73 blocks of 35 tokens: the LSTM demo's batch sampler makes 3 batches of 20
            picks = torch.randint(0, len(words), (12,), generator=generator).tolist()
            f.write(" ".join(words[i] for i in picks) + "\n")
    mnist = os.path.join(root, "mnist", "MNIST", "complete")
    os.makedirs(mnist, exist_ok=True)
    for name, count in (("training.pt", MNIST_TRAIN), ("test.pt", MNIST_TEST)):
        images = torch.randint(0, 256, (count, 28, 28), dtype=torch.uint8, generator=generator)
        labels = torch.randint(0, 10, (count,), generator=generator)
        torch.save((images, labels), os.path.join(mnist, name))


class MNISTClassifier(L.LightningModule):
    """A small classifier for the MNIST DataModule, written in Lightning's idioms (the demos have none)."""

    def __init__(self, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 10))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class UnevenBoringModel(BoringModel):
    """BoringModel as its docstring says to use it (subclassed, behaviour modified): sizes that divide
    neither the batch nor the ranks (short last batches, uneven shards)."""

    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 61), batch_size=4)

    def val_dataloader(self):
        return DataLoader(RandomDataset(32, 29), batch_size=3)

    def test_dataloader(self):
        return DataLoader(RandomDataset(32, 23), batch_size=5)

    def predict_dataloader(self):
        return DataLoader(RandomDataset(32, 37), batch_size=4)


def _full_state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's parameters and buffers, whole (an FSDP shard's full tensor), on the CPU."""
    state = {}
    for name, value in module.state_dict().items():
        full = getattr(value, "full_tensor", None)
        state[name] = (full() if full is not None else value).detach().cpu().clone()
    return state


def without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with its dropout off (set by the test, the demo's code unchanged): each rank draws its own
    dropout masks, so with dropout no 2-rank run can equal one process; everything else still can."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        elif isinstance(module, (torch.nn.LSTM, torch.nn.MultiheadAttention)):
            module.dropout = 0.0
    return model


def _predictions(outputs: Any) -> Any:
    if isinstance(outputs, list) and outputs and all(isinstance(o, torch.Tensor) for o in outputs):
        return torch.cat([o.reshape(-1) for o in outputs])
    return outputs


# ----- the cases: each builds the demo as a user would and calls the trainer ------------------------------
def boring(make_trainer: Callable[..., Any], root: str) -> dict[str, Any]:
    model = BoringModel()
    trainer = make_trainer(max_steps=4)
    return {"initial": lambda: _full_state(model), "fit": lambda: trainer.fit(model), "params": lambda: _full_state(model),
            "validate": lambda: trainer.validate(), "test": lambda: trainer.test(),
            "predict": lambda: _predictions(trainer.predict())}


def boring_uneven_sizes(make_trainer: Callable[..., Any], root: str) -> dict[str, Any]:
    model = UnevenBoringModel()
    trainer = make_trainer(max_steps=8)  # one epoch: 7 global batches of 8 and one of 5
    return {"initial": lambda: _full_state(model), "fit": lambda: trainer.fit(model), "params": lambda: _full_state(model),
            "validate": lambda: trainer.validate(), "test": lambda: trainer.test(),
            "predict": lambda: _predictions(trainer.predict())}


def boring_datamodule(make_trainer: Callable[..., Any], root: str) -> dict[str, Any]:
    from tests.support.lightning_demos.boring_classes import BoringDataModule, BoringModel

    model, datamodule = BoringModel(), BoringDataModule()
    trainer = make_trainer(max_steps=4)
    return {"initial": lambda: _full_state(model), "fit": lambda: trainer.fit(model, datamodule=datamodule), "params": lambda: _full_state(model),
            "validate": lambda: trainer.validate(datamodule=datamodule),
            "test": lambda: trainer.test(datamodule=datamodule),
            "predict": lambda: _predictions(trainer.predict(datamodule=datamodule))}


def manual_optimization(make_trainer: Callable[..., Any], root: str) -> dict[str, Any]:
    from tests.support.lightning_demos.boring_classes import ManualOptimBoringModel

    model = ManualOptimBoringModel()
    trainer = make_trainer(max_steps=4, accumulate=False)
    return {"initial": lambda: _full_state(model), "fit": lambda: trainer.fit(model), "params": lambda: _full_state(model),
            "validate": lambda: trainer.validate(), "test": lambda: trainer.test(),
            "predict": lambda: _predictions(trainer.predict())}


def demo_model(make_trainer: Callable[..., Any], root: str) -> dict[str, Any]:
    from tests.support.lightning_demos.boring_classes import BoringDataModule, DemoModel

    model, datamodule = DemoModel(), BoringDataModule()
    trainer = make_trainer(max_steps=4)
    return {"initial": lambda: _full_state(model), "fit": lambda: trainer.fit(model, datamodule=datamodule), "params": lambda: _full_state(model),
            "predict": lambda: _predictions(trainer.predict(datamodule=datamodule))}


def lstm(make_trainer: Callable[..., Any], root: str) -> dict[str, Any]:
    from tests.support.lightning_demos.lstm import LightningLSTM

    model = without_dropout(LightningLSTM(vocab_size=WORDS))
    trainer = make_trainer(max_steps=3, accumulate=False)  # its batch sampler's batches are the global batches
    return {"initial": lambda: _full_state(model), "fit": lambda: trainer.fit(model), "params": lambda: _full_state(model)}


def mnist(make_trainer: Callable[..., Any], root: str) -> dict[str, Any]:
    from tests.support.lightning_demos.mnist_datamodule import MNISTDataModule

    datamodule = MNISTDataModule(data_dir=os.path.join(root, "mnist"), val_split=MNIST_VAL_SPLIT, num_workers=0,
                                 batch_size=MNIST_BATCH)
    model = MNISTClassifier()
    trainer = make_trainer(max_steps=4)
    return {"initial": lambda: _full_state(model), "fit": lambda: trainer.fit(model, datamodule=datamodule), "params": lambda: _full_state(model),
            "validate": lambda: trainer.validate(datamodule=datamodule),
            "test": lambda: trainer.test(datamodule=datamodule)}


def transformer(make_trainer: Callable[..., Any], root: str) -> dict[str, Any]:
    from tests.support.lightning_demos.transformer import LightningTransformer

    model = without_dropout(LightningTransformer(vocab_size=WORDS))
    trainer = make_trainer(max_steps=2)
    return {"initial": lambda: _full_state(model), "fit": lambda: trainer.fit(model), "params": lambda: _full_state(model)}


CASES = {f.__name__: f for f in (boring, boring_uneven_sizes, boring_datamodule, manual_optimization, demo_model, lstm, mnist, transformer)}


def run_all(strategy: str, root: str, cases: tuple[str, ...] = tuple(CASES)) -> dict[str, dict[str, Any]]:
    """Every case on ``strategy`` ("single", or "ddp" / "fsdp" in each of 2 ranks): ``{case: {call: result}}``,
    a call that raised giving ``{"error": "Type: message"}`` (and the case's later calls not run)."""
    devices = 1 if strategy == "single" else 2
    results: dict[str, dict[str, Any]] = {}
    for name in cases:
        def make_trainer(max_steps: int, accumulate: bool = True, case: str = name) -> Any:
            # One process takes the same global batch as 2 ranks of the demos' per-rank batches.
            accumulate_grad_batches = 2 if (strategy == "single" and accumulate) else 1
            return L.Trainer(strategy=strategy, devices=devices, accelerator="cpu", max_steps=max_steps,
                             accumulate_grad_batches=accumulate_grad_batches,
                             num_sanity_val_steps=0, loggers=[], progress_bar=False, checkpoint=None,
                             enable_model_summary=False, collective_timeout_s=60, seed=0,
                             run_dir=os.path.join(root, "runs", strategy, case))

        torch.manual_seed(0)  # (L.seed_everything(0)) the same initial weights on every strategy
        results[name] = out = {}
        try:
            calls = CASES[name](make_trainer, root)
        except Exception as error:  # building the demo failed
            out["error"] = f"{type(error).__name__}: {error}"
            continue
        for call, run in calls.items():
            try:
                out[call] = run()
            except Exception as error:
                out["error"] = f"{call}: {type(error).__name__}: {error}"
                out["traceback"] = traceback.format_exc()
                break
    return results


def _rank_entry(strategy: str, root: str, cases: tuple[str, ...], path: str) -> None:
    # One process group for all the cases: the trainer joins it instead of starting its own per call.
    from trainer.runtime import distributed
    from trainer.runtime.launch import detect_environment

    os.chdir(root)
    distributed.init_process_group(detect_environment(), "gloo", timedelta(seconds=60))
    try:
        results = run_all(strategy, root, cases)
        # Through a file: the launcher's result queue is for small results (it is read after the ranks end).
        if distributed.rank() == 0:
            with open(path, "wb") as f:
                pickle.dump(results, f)
    finally:
        distributed.destroy_process_group()


def run_ranks(strategy: str, root: str, cases: tuple[str, ...] = tuple(CASES)) -> dict[str, dict[str, Any]]:
    """``run_all(strategy, root)`` in 2 ranks started once (the trainer's launcher); rank 0's results."""
    from trainer.runtime.launch import spawn

    path = os.path.join(root, f"results-{strategy}.pickle")
    spawn(_rank_entry, (strategy, root, cases, path), nprocs=2, timeout=timedelta(seconds=120))
    with open(path, "rb") as f:
        return pickle.load(f)
