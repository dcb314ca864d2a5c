"""Token streams packed into fixed-length training sequences, read through ``numpy.memmap``.

A *part* is one 1-D token array: a shard file of ``prepare_text`` (opened as a memmap, never read
whole) or an in-memory array (the byte-level text). Each part is cut into non-overlapping windows
of ``block_size + 1`` tokens (consecutive windows share one token): sample = (input, next-token
target), both ``block_size`` long, int64. Windows cross document borders, as GPT pretraining does:
documents are separated by the end-of-document token and the model learns to restart after it. A
part's last ``< block_size + 1`` tokens are dropped (one part = one shard, so map-style and
streaming read the same sequences).

``PackedBlocks``: a map-style Dataset over every window (the default: exact global-batch
invariance with the trainer's plan). A micro-batch is read as one gather of its windows per part
(``gather_batch``, which the trainer uses with the default collate, trainer/data/batched_read.py;
``__getitems__`` for a ``DataLoader``), not a slice per sample. ``PackedStream``: the same windows as an IterableDataset with
the trainer's shard protocol (``n_shards`` and ``shard_samples(shard, epoch)``), one shard per part.
"""

from __future__ import annotations

import os
from typing import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from trainer.data.batched_read import batch_tensor
from trainer.recipes.token_shards import read_manifest


class _Parts:
    """The token arrays, opened lazily (a memmap per file) and never pickled with their data."""

    def __init__(self, parts: Sequence[str | np.ndarray], dtype: np.dtype | None, block_size: int):
        if block_size < 1:
            raise ValueError(f"block_size={block_size}: give a positive context length")
        self.sources, self.dtype, self.block_size = list(parts), dtype, block_size
        self._arrays: list[np.ndarray] | None = None
        self._windows: dict[int, np.ndarray] = {}
        # windows per part: (tokens - 1) // block_size (a file's length from its size, not its data)
        lengths = [len(p) if isinstance(p, np.ndarray) else os.path.getsize(p) // dtype.itemsize for p in self.sources]
        self.windows = [max(n - 1, 0) // block_size for n in lengths]

    def arrays(self) -> list[np.ndarray]:
        if self._arrays is None:
            self._arrays = [p if isinstance(p, np.ndarray) else np.memmap(p, dtype=self.dtype, mode="r")
                            for p in self.sources]
        return self._arrays

    def window(self, part: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.block_size
        chunk = torch.from_numpy(np.array(self.arrays()[part][start: start + self.block_size + 1], dtype=np.int64))
        return chunk[:-1], chunk[1:]

    def windows_of(self, part: int) -> np.ndarray:
        """A part's windows as a read-only ``(windows, block_size + 1)`` view of its array (no copy:
        rows ``block_size`` tokens apart); indexing it with several rows reads them in one gather."""
        view = self._windows.get(part)
        if view is None:
            tokens = self.arrays()[part][: self.windows[part] * self.block_size + 1]
            view = np.lib.stride_tricks.sliding_window_view(tokens, self.block_size + 1)[:: self.block_size]
            self._windows[part] = view
        return view

    def __getstate__(self) -> dict:
        # A worker (or a spawned rank) reopens the files itself: pickling a memmap would copy its data.
        return {**self.__dict__, "_arrays": None, "_windows": {}}


class PackedBlocks(Dataset):
    """Every window of every part, in part order: sample i = (input, next-token target)."""

    def __init__(self, parts: Sequence[str | np.ndarray], block_size: int, dtype: np.dtype | None = None):
        self.parts = _Parts(parts, dtype, block_size)
        self._starts = np.cumsum([0] + self.parts.windows)

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} sequences")
        index %= len(self)
        part = int(np.searchsorted(self._starts, index, side="right")) - 1
        return self.parts.window(part, index - int(self._starts[part]))

    def gather_batch(self, indices: Sequence[int]) -> list[torch.Tensor]:
        """``[inputs, targets]`` of the windows at ``indices``, each ``(len(indices), block_size)``
        int64: what ``default_collate([self[i] for i in indices])`` gives, read as one gather per part."""
        size = self.parts.block_size
        inputs, targets = batch_tensor((len(indices), size), torch.int64), batch_tensor((len(indices), size), torch.int64)
        into_inputs, into_targets = inputs.numpy(), targets.numpy()
        for rows, windows in self._gathered(indices):
            into_inputs[rows], into_targets[rows] = windows[:, :-1], windows[:, 1:]
        return [inputs, targets]

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The samples at ``indices`` (``DataLoader``'s batch read, for any collate function): equal
        to ``[self[i] for i in indices]``, their windows read in one gather per part."""
        tokens = torch.empty((len(indices), self.parts.block_size + 1), dtype=torch.int64)
        into = tokens.numpy()
        for rows, windows in self._gathered(indices):
            into[rows] = windows
        return [(row[:-1], row[1:]) for row in tokens]

    def _gathered(self, indices: Sequence[int]) -> Iterator[tuple[slice | np.ndarray, np.ndarray]]:
        """``(rows of the batch, their windows)`` for each part the windows at ``indices`` are in."""
        index = np.asarray(indices, dtype=np.int64).reshape(-1)
        count = len(self)
        outside = (index < -count) | (index >= count)
        if outside.any():
            raise IndexError(f"index {int(index[outside][0])} out of range for {count} sequences")
        index = np.where(index < 0, index + count, index)
        part = np.searchsorted(self._starts, index, side="right") - 1
        local = index - self._starts[part]
        parts = np.unique(part)
        for one in parts.tolist():
            rows = slice(None) if len(parts) == 1 else part == one
            yield rows, self.parts.windows_of(one)[local[rows]]


class PackedStream(IterableDataset):
    """The windows of ``PackedBlocks`` as a stream, one shard per part (shard protocol).

    ``shard_samples(shard, epoch)`` yields the shard's windows in an order shuffled by
    ``(seed, epoch, shard)`` (``shuffle=False``: in file order); the trainer orders the shards.
    Iterating it directly (outside the trainer) reads the shards in order for epoch 0, each
    data-loader worker its own shards.
    """

    def __init__(self, parts: Sequence[str | np.ndarray], block_size: int, dtype: np.dtype | None = None,
                 shuffle: bool = True, seed: int = 0):
        self.parts = _Parts(parts, dtype, block_size)
        self.shuffle, self.seed = shuffle, seed

    @property
    def n_shards(self) -> int:
        return len(self.parts.sources)

    def shard_samples(self, shard: int, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if not 0 <= shard < self.n_shards:
            raise IndexError(f"shard {shard} out of range for {self.n_shards} shards")
        count = self.parts.windows[shard]
        order = np.random.default_rng([self.seed, epoch, shard]).permutation(count) if self.shuffle else range(count)
        for index in order:
            yield self.parts.window(shard, int(index))

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        worker = get_worker_info()
        first, step = (0, 1) if worker is None else (worker.id, worker.num_workers)
        for shard in range(first, self.n_shards, step):
            yield from self.shard_samples(shard, 0)


def _shard_paths(directory: str, manifest: dict, split: str) -> list[str]:
    return [os.path.join(directory, shard["file"]) for shard in manifest[split]]


def token_shard_datasets(directory: str, block_size: int, stream: bool = False, seed: int = 0):
    """``(train, val, manifest)`` from a ``prepare_text`` output: train is ``PackedStream`` when
    ``stream`` else ``PackedBlocks``; val is always map-style (a held-out tail, read in order), or
    None when the manifest has no validation shards."""
    manifest = read_manifest(directory)
    dtype = np.dtype(manifest["dtype"]).newbyteorder("<")
    paths = _shard_paths(directory, manifest, "train")
    train = PackedStream(paths, block_size, dtype, seed=seed) if stream else PackedBlocks(paths, block_size, dtype)
    sequences = sum(train.parts.windows)
    if sequences == 0:
        raise ValueError(f"data.tokens={directory!r}: its train shards hold no sequence of block_size + 1 = "
                         f"{block_size + 1} tokens; use a smaller block_size, larger shards or more text")
    val_paths = _shard_paths(directory, manifest, "val")
    val = PackedBlocks(val_paths, block_size, dtype) if val_paths else None
    if val is not None and len(val) == 0:
        raise ValueError(f"data.tokens={directory!r}: its validation shards hold fewer than block_size + 1 = "
                         f"{block_size + 1} tokens; prepare it with a larger --val-fraction (or 0 for none)")
    return train, val, manifest
