"""The text recipes' data, chosen in one place (recipe=gpt and recipe=llama share it).

    (default)            Python's own standard-library source text, as bytes (offline)
    data.path=FILE       a UTF-8 text file, as bytes
    data.tokens=DIR      token shards made by ``trainer prepare-text INPUT... DIR``
    data.source=hf       a local Hugging Face dataset (``data.hf.*``), by ``recipes/hf_text.py``
    data.stream=true     the training set as an IterableDataset (the shard protocol) instead of a
                         map-style Dataset; validation stays map-style

Bytes have a 256-symbol vocabulary; token shards bring theirs (manifest) and a token -> UTF-8
byte-length table, so bits per byte compares across tokenizers.
"""

from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from trainer.recipes.token_data import PackedBlocks, PackedStream

SOURCES = ("text", "tokens", "hf")


@dataclass
class TextData:
    """What a text recipe trains on. ``token_bytes``: UTF-8 bytes per token id (0 for special
    tokens), or None when every token is one byte."""

    train: Dataset
    val: Dataset | None
    vocab_size: int
    token_bytes: np.ndarray | None = None


def python_stdlib_text(max_bytes: int) -> bytes:
    """Up to ``max_bytes`` of the standard library's ``.py`` files, in sorted order: real text
    every Python installation has."""
    stdlib = sysconfig.get_paths()["stdlib"]
    chunks, size = [], 0
    for name in sorted(os.listdir(stdlib)):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(stdlib, name), "rb") as handle:
            data = handle.read()
        chunks.append(data)
        size += len(data)
        if size >= max_bytes:
            break
    return b"".join(chunks)[:max_bytes]


def source_of(path: str | None, tokens: str | None, source: str | None) -> str:
    """Which source the settings pick; two that contradict each other are an error."""
    if source is not None and source not in SOURCES:
        raise ValueError(f"data.source={source!r}: choose one of {', '.join(SOURCES)} (or null: from data.path / data.tokens)")
    if path is not None and tokens is not None:
        raise ValueError(f"data.path={path!r} and data.tokens={tokens!r}: give one (a text file, or token shards)")
    implied = "tokens" if tokens is not None else "text"
    if source is None or source == implied:
        return implied
    given = f"data.path={path!r}" if path is not None else f"data.tokens={tokens!r}" if tokens is not None else None
    if source == "hf" and given is None:
        return "hf"
    if given is None:  # data.source=tokens without data.tokens
        raise ValueError("data.source=tokens needs data.tokens=DIR (a prepare_text output)")
    raise ValueError(f"data.source={source!r} with {given}: the {source} source does not read it; unset one")


def check_settings(path: str | None, tokens: str | None, source: str | None, stream: bool,
                   tokenizer: str | None = None, hf: dict | None = None) -> str:
    """The source the ``data.*`` settings pick (``text``, ``tokens`` or ``hf``), checked without
    reading any data: a bad or contradicting setting is an error naming it."""
    if not isinstance(stream, bool):
        raise ValueError(f"data.stream={stream!r}: give true or false")
    if path is not None and not os.path.isfile(path):
        raise FileNotFoundError(f"data.path={path!r} is not a file; give a UTF-8 text file, or null for the built-in text")
    if tokens is not None and not os.path.isdir(tokens):
        raise FileNotFoundError(f"data.tokens={tokens!r} is not a directory; make one with trainer prepare-text INPUT... DIR")
    chosen = source_of(path, tokens, source)
    if chosen != "hf":
        unused = [f"data.{name}={value!r}" for name, value in (("tokenizer", tokenizer), ("hf", hf)) if value]
        if unused:
            raise ValueError(f"{', '.join(unused)}: read only with data.source=hf (the {chosen} source is in use)")
    return chosen


def _byte_text(path: str | None, max_bytes: int) -> np.ndarray:
    if path is None:
        raw = python_stdlib_text(max_bytes)
    else:
        with open(path, "rb") as handle:
            raw = handle.read()
    return np.frombuffer(raw, dtype=np.uint8)


def _byte_datasets(path: str | None, max_bytes: int, block_size: int, val_fraction: float, stream: bool, seed: int) -> TextData:
    data = _byte_text(path, max_bytes)
    if len(data) < 4 * (block_size + 1):
        raise ValueError(f"the text has {len(data)} bytes; need at least {4 * (block_size + 1)} for block_size={block_size}")
    cut = int(len(data) * (1 - val_fraction))  # the tail is held out for validation
    train = PackedStream([data[:cut]], block_size, seed=seed) if stream else PackedBlocks([data[:cut]], block_size)
    return TextData(train, PackedBlocks([data[cut:]], block_size), vocab_size=256)


def _hf_datasets(options: dict[str, Any], block_size: int, stream: bool, tokenizer_path: str | None) -> TextData:
    from omegaconf import OmegaConf

    try:
        from trainer.recipes.hf_text import hf_text_datasets
    except ImportError as error:
        raise ValueError(f"data.source=hf needs recipes/hf_text.py and the extra 'data' (pip install -e .[data]): {error}") from error
    from trainer.recipes.tokenizer_io import load_tokenizer, token_byte_lengths

    hf = dict(options.get("hf") or {})
    if stream:  # data.stream=true is the streaming path for every source; hf calls it data.hf.streaming
        hf["streaming"] = True
    tokenizer = load_tokenizer(tokenizer_path) if tokenizer_path is not None else None
    train, val = hf_text_datasets(OmegaConf.create({**options, "hf": hf}), block_size, tokenizer)
    if tokenizer is None:  # bytes; the dataset may add an end-of-document id above 255
        return TextData(train, val, vocab_size=getattr(train, "vocab_size", 256))
    return TextData(train, val, tokenizer.get_vocab_size(with_added_tokens=True), token_byte_lengths(tokenizer))


def text_datasets(block_size: int, path: str | None = None, tokens: str | None = None, source: str | None = None,
                  stream: bool = False, max_bytes: int = 1_000_000, val_fraction: float = 0.05, seed: int = 0,
                  tokenizer: str | None = None, hf: dict | None = None) -> TextData:
    """The train / validation sets and vocabulary the ``data.*`` settings pick (module docstring).

    ``max_bytes`` and ``val_fraction`` apply to the byte text (token shards carry their own split);
    ``seed`` shuffles a stream's sequences within each shard; ``tokenizer`` (a tokenizer.json) and
    ``hf`` (``data.hf``) are for ``data.source=hf``.
    """
    chosen = check_settings(path, tokens, source, stream, tokenizer, hf)
    if chosen == "text":
        return _byte_datasets(path, max_bytes, block_size, val_fraction, stream, seed)
    if chosen == "hf":
        return _hf_datasets({"hf": hf, "stream": stream, "tokenizer": tokenizer}, block_size, stream, tokenizer)
    from trainer.recipes.token_data import token_shard_datasets
    from trainer.recipes.tokenizer_io import load_tokenizer, token_byte_lengths

    train, val, manifest = token_shard_datasets(tokens, block_size, stream, seed)
    token_bytes = token_byte_lengths(load_tokenizer(os.path.join(tokens, manifest["tokenizer"])))
    return TextData(train, val, manifest["vocab_size"], token_bytes)
