"""Loaders that are not plain DataLoaders over map-style sets, written once for Lightning and for
``trainer.lightning`` (``build(pl, Steps)`` from tests/support/lightning_loop_modules.py): iterables of
ready batches (a wrapper without a length, one whose ``__len__`` raises ``NotImplementedError``, a list
of tensors), several training loaders, ``IterableDataset`` streams for test / predict, and a stream
that is empty in some epochs."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

import trainer.lightning as ours


def samples(count: int, offset: float = 0.0) -> TensorDataset:
    """``count`` samples ``x = [2i, 2i + 1] / 10 + offset`` (a regression on them has distinct gradients)."""
    return TensorDataset(torch.arange(2.0 * count).view(count, 2) / 10 + offset)


class Unsized:
    """A wrapper around a DataLoader with no ``__len__``: iterating it iterates the loader."""

    def __init__(self, loader: DataLoader):
        self.loader = loader

    def __iter__(self):
        return iter(self.loader)


class LengthNotImplemented(Unsized):
    """A wrapper whose ``__len__`` raises ``NotImplementedError`` (Lightning: no length)."""

    def __len__(self):
        raise NotImplementedError


class Counted(Unsized):
    """A wrapper with its loader's length."""

    def __len__(self):
        return len(self.loader)


class Endless(Unsized):
    """A wrapper that never ends: its loader again and again (a run needs ``max_steps``)."""

    def __iter__(self):
        while True:
            yield from self.loader


WRAPPERS = {"unsized": Unsized, "len_raises": LengthNotImplemented, "sized": Counted, "endless": Endless}


class Stream(IterableDataset):
    """``count`` samples of ``samples(count)``, as a stream (``sized``: with ``__len__``)."""

    def __init__(self, count: int, sized: bool = False):
        self.count, self.sized = count, sized

    def __iter__(self):
        yield from (row for (row,) in samples(self.count))

    def __len__(self):
        if not self.sized:
            raise TypeError("no length")
        return self.count


class SizedStream(Stream):
    def __init__(self, count: int):
        super().__init__(count, sized=True)


class ReadySteps:
    """A linear regression whose loaders are of the kind ``options["kind"]`` names; records its hook calls
    (``options["train_batch"]``: the training batch size of a single loader, 4 by default; ``shuffle``: its
    DataLoader shuffles)."""

    def __init__(self, kind: str = "unsized", **options: Any):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(2, 1)
        self.kind, self.options, self.calls = kind, options, []

    def _x(self, batch: Any) -> torch.Tensor:
        return batch[0] if isinstance(batch, (list, tuple)) else batch

    def training_step(self, batch, batch_idx):
        if self.kind.startswith("several"):
            parts = list(batch.values()) if isinstance(batch, dict) else batch
            loss = sum(self.layer(self._x(part)).pow(2).mean() for part in parts)
        else:
            loss = self.layer(self._x(batch)).pow(2).mean()
        self.calls.append(("training_step", self.current_epoch, batch_idx))
        self.log("l", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.calls.append(("validation_step", self.current_epoch, batch_idx))
        self.log("v", self.layer(self._x(batch)).mean())

    def test_step(self, batch, batch_idx):
        self.calls.append(("test_step", batch_idx))
        self.log("t", self.layer(self._x(batch)).mean())

    def predict_step(self, batch, batch_idx):
        return self.layer(self._x(batch))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def _loader(self, count: int, batch_size: int = 4, offset: float = 0.0, shuffle: bool = False) -> Any:
        kind = self.kind
        if kind in WRAPPERS:
            return WRAPPERS[kind](DataLoader(samples(count, offset), batch_size=batch_size, shuffle=shuffle))
        if kind in ("stream", "sized_stream"):
            return DataLoader((SizedStream if kind == "sized_stream" else Stream)(count), batch_size=batch_size)
        return DataLoader(samples(count, offset), batch_size=batch_size)

    def train_dataloader(self):
        if self.kind == "several":  # 16 and 6 samples in batches of 4: 4 and 2 batches, the second cycles
            return [DataLoader(samples(16), batch_size=4), DataLoader(samples(6, 1.0), batch_size=4)]
        if self.kind == "several_shuffled":  # under overfit_batches: read in dataset order (as Lightning)
            return [DataLoader(samples(16), batch_size=4, shuffle=True), DataLoader(samples(6, 1.0), batch_size=4,
                                                                                   shuffle=True)]
        if self.kind == "list":  # a list of one tensor: in Lightning one training loader (the tensor's rows)
            return [torch.arange(32.0).view(16, 2) / 10]
        if self.kind == "several_dict":
            return {"a": DataLoader(samples(6, 1.0), batch_size=2), "b": DataLoader(samples(16), batch_size=4)}
        return self._loader(16, batch_size=self.options.get("train_batch", 4), shuffle=self.options.get("shuffle", False))

    def val_dataloader(self):
        return self._loader(6, batch_size=2, offset=0.5)

    def test_dataloader(self):
        return self._loader(10, batch_size=3, offset=0.25)

    predict_dataloader = test_dataloader


class EmptyEpochsSteps(ReadySteps):
    """A training stream with samples in epoch 0 only (``options["at_all"]``: none in any epoch)."""

    def train_dataloader(self):
        module = self

        class EpochStream(IterableDataset):
            def __iter__(self):
                if module.options.get("at_all") and module.current_epoch == 0:
                    yield from (row for (row,) in samples(6))

        return DataLoader(EpochStream(), batch_size=2)


def build(pl: Any, steps: type) -> type:
    """The LightningModule of package ``pl`` (Lightning's, or ``trainer.lightning``) with ``steps``' hooks."""
    return type(steps.__name__.replace("Steps", ""), (steps, pl.LightningModule), {"__module__": __name__})


Ready = build(ours, ReadySteps)
EmptyEpochs = build(ours, EmptyEpochsSteps)
