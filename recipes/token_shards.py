"""Token shards on disk: raw little-endian uint16 / uint32 ``.bin`` files plus ``manifest.json``.

Written streaming (a shard is appended to as tokens come; nothing holds the whole corpus), read
with ``numpy.memmap`` (``recipes/token_data.py``). The manifest is the format's only index:
``{"format": 1, "dtype", "vocab_size", "eod_id", "tokenizer", "train": [shard...], "val": [shard...]}``
with each shard ``{"file", "tokens", "bytes"}`` (``bytes`` = file size = tokens x itemsize).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

MANIFEST = "manifest.json"
FORMAT = 1
_COPY_TOKENS = 1 << 22  # moving a shard's tail to the validation split: 4 Mi tokens at a time


def shard_dtype(choice: str, vocab_size: int) -> np.dtype:
    """``auto``: uint16 when every id fits (vocab <= 65536), else uint32; little-endian either way."""
    if choice not in ("auto", "uint16", "uint32"):
        raise ValueError(f"--dtype {choice}: choose auto, uint16 or uint32")
    if choice == "auto":
        choice = "uint16" if vocab_size <= 1 << 16 else "uint32"
    if choice == "uint16" and vocab_size > 1 << 16:
        raise ValueError(f"--dtype uint16 holds ids below 65536, but the vocabulary has {vocab_size}; use uint32 or auto")
    return np.dtype(choice).newbyteorder("<")


class ShardWriter:
    """Appends token ids to ``<prefix>_00000.bin``, ``<prefix>_00001.bin``, ... of at most
    ``shard_tokens`` tokens each."""

    def __init__(self, out_dir: str, prefix: str, dtype: np.dtype, shard_tokens: int):
        if shard_tokens < 1:
            raise ValueError(f"--shard-tokens {shard_tokens}: give a positive number of tokens per shard")
        self.out_dir, self.prefix, self.dtype, self.shard_tokens = out_dir, prefix, dtype, shard_tokens
        self.shards: list[dict[str, Any]] = []
        self._handle = None

    def write(self, ids: np.ndarray) -> None:
        ids = np.asarray(ids).astype(self.dtype, copy=False)
        while len(ids):
            if self._handle is None or self.shards[-1]["tokens"] == self.shard_tokens:
                self._open_next()
            room = self.shard_tokens - self.shards[-1]["tokens"]
            part, ids = ids[:room], ids[room:]
            self._handle.write(part.tobytes())
            self.shards[-1]["tokens"] += len(part)
            self.shards[-1]["bytes"] += part.nbytes

    def _open_next(self) -> None:
        self.close()
        name = f"{self.prefix}_{len(self.shards):05d}.bin"
        self._handle = open(os.path.join(self.out_dir, name), "wb")
        self.shards.append({"file": name, "tokens": 0, "bytes": 0})

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def split_tail(out_dir: str, train: ShardWriter, val: ShardWriter, val_tokens: int) -> None:
    """Move the last ``val_tokens`` tokens of ``train``'s shards into ``val``'s (in order, a chunk
    at a time), truncating or deleting the train shards they came from."""
    train.close()
    total = sum(shard["tokens"] for shard in train.shards)
    cut, start = total - val_tokens, 0
    keep = []
    for shard in train.shards:
        end = start + shard["tokens"]
        path = os.path.join(out_dir, shard["file"])
        if end > cut:
            first = max(cut - start, 0)  # this shard's tokens from here on go to validation
            tokens = np.memmap(path, dtype=train.dtype, mode="r")
            for offset in range(first, shard["tokens"], _COPY_TOKENS):
                val.write(np.array(tokens[offset: offset + _COPY_TOKENS]))
            del tokens
            if first == 0:
                os.remove(path)
            else:
                with open(path, "r+b") as handle:
                    handle.truncate(first * train.dtype.itemsize)
                shard.update(tokens=first, bytes=first * train.dtype.itemsize)
        if min(end, cut) > start:
            keep.append(shard)
        start = end
    train.shards = keep
    val.close()


def write_manifest(out_dir: str, **fields: Any) -> str:
    path = os.path.join(out_dir, MANIFEST)
    with open(path, "w") as handle:
        json.dump({"format": FORMAT, **fields}, handle, indent=1)
    return path


def read_manifest(directory: str) -> dict[str, Any]:
    """The manifest of a ``prepare_text`` output, checked against the files beside it (sizes only)."""
    path = os.path.join(directory, MANIFEST)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"data.tokens={directory!r} has no {MANIFEST}; make one with "
                                f"trainer prepare-text INPUT... {directory}")
    with open(path) as handle:
        manifest = json.load(handle)
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: format {manifest.get('format')!r}, this code reads format {FORMAT}")
    itemsize = np.dtype(manifest["dtype"]).itemsize
    for shard in manifest["train"] + manifest["val"]:
        file = os.path.join(directory, shard["file"])
        size = os.path.getsize(file) if os.path.isfile(file) else None
        if size != shard["tokens"] * itemsize or size != shard["bytes"]:
            raise ValueError(f"{file}: {'missing' if size is None else f'{size} bytes'}, the manifest says "
                             f"{shard['bytes']} bytes ({shard['tokens']} tokens); run prepare_text again")
    return manifest
