"""``data.source=hf``: a local Hugging Face ``datasets`` dataset (text / json / parquet files),
tokenized on the fly and packed into fixed-length sequences for the text recipes.

Each data file is one shard. A shard's documents (rows; for ``text`` files, ``sample_by``'s unit)
are tokenized in order, each followed by the end-of-document token, concatenated, and cut into
samples of ``block_size + 1`` tokens that overlap by one token (sample i starts at token
i * block_size, as the gpt recipe's byte blocks do: every token but a shard's first is a target
once); a shard's tail shorter than that is dropped. Samples never cross files, so the map-style
dataset (``streaming: false``) and the stream (``streaming: true``) hold the same samples in the
same order: file 0's, then file 1's, ...

Only local files are read: the files are checked before ``datasets`` is asked, and ``datasets`` is
put offline (``HF_DATASETS_OFFLINE=1``) when this module is what imports it.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from trainer.data.batched_read import batch_tensor

FORMATS = ("text", "json", "parquet")
SAMPLE_BY = ("line", "paragraph", "document")
#: the keys of ``data.hf`` and their defaults
DEFAULTS: dict[str, Any] = dict(format="json", files=None, val_files=None, text_field="text", streaming=False,
                                eod_token="<|endoftext|>", sample_by=None, cache_dir=None)
BYTE_EOD = 256  # bytes are ids 0-255; the end-of-document token follows them
_TOKENIZE_BATCH = 1000  # documents per tokenizer call (tokenizers encodes a batch in parallel)


def hf_text_datasets(data_cfg: Mapping[str, Any], block_size: int, tokenizer=None) -> tuple[Dataset, Dataset | None]:
    """The (train, validation) datasets of ``data.hf``: map-style ``PackedText`` (``streaming:
    false``) or ``StreamingPackedText`` (``streaming: true``, the shard protocol); validation is
    None without ``val_files``. Samples are ``(input, target)`` pairs of ``block_size`` token ids.

    Args:
        data_cfg: the ``data`` config node (its ``hf`` block is read) or the ``hf`` block itself.
        block_size: tokens per sample's input.
        tokenizer: a ``tokenizers.Tokenizer`` (e.g. ``Tokenizer.from_file("tokenizer.json")``), or
            None for bytes (UTF-8; end of document = 256, so the vocabulary is 257).

    Both datasets carry ``vocab_size`` (what the model's embedding needs) and ``eod_id``.
    """
    hf_cfg = data_cfg["hf"] if "hf" in data_cfg else data_cfg if "files" in data_cfg else None
    if hf_cfg is None:
        raise ValueError("data.source=hf needs a data.hf block (format, files, text_field, ...); see recipes/hf_text.py")
    source = HFSource(hf_cfg, tokenizer)
    if block_size < 1:
        raise ValueError(f"data.block_size={block_size} must be >= 1")
    kind = StreamingPackedText if source.streaming else PackedText
    train = kind(source, source.files, block_size)
    val = kind(source, source.val_files, block_size) if source.val_files else None
    return train, val


def _resolve_files(key: str, patterns: Any) -> list[str]:
    """Each pattern's matches, sorted (a deterministic shard order); a file or pattern that matches
    nothing is an error naming it."""
    if isinstance(patterns, str):
        patterns = [patterns]
    files: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(os.path.expanduser(str(pattern))))
        if not matches or not all(os.path.isfile(m) for m in matches):
            raise FileNotFoundError(f"data.hf.{key}: {pattern!r} is not a file (or a pattern matching files); "
                                    "data.source=hf reads local files only")
        files.extend(matches)
    return files


class HFSource:
    """The checked ``data.hf`` settings and a tokenizer: documents of one file -> token ids."""

    def __init__(self, hf_cfg: Mapping[str, Any], tokenizer=None):
        unknown = sorted(set(hf_cfg) - set(DEFAULTS))
        if unknown:
            raise ValueError(f"data.hf.{unknown[0]} is not a setting of data.source=hf; the settings are "
                             f"{', '.join(DEFAULTS)}")
        cfg = {**DEFAULTS, **hf_cfg}
        self.format, self.text_field, self.streaming = cfg["format"], cfg["text_field"], bool(cfg["streaming"])
        if self.format not in FORMATS:
            raise ValueError(f"data.hf.format={self.format!r} is not one of {', '.join(FORMATS)}")
        if cfg["sample_by"] is not None and self.format != "text":
            raise ValueError(f"data.hf.sample_by={cfg['sample_by']!r} applies to data.hf.format=text only "
                             f"(a {self.format} row is one document); set it to null")
        self.sample_by = cfg["sample_by"] or "document"
        if self.sample_by not in SAMPLE_BY:
            raise ValueError(f"data.hf.sample_by={self.sample_by!r} is not one of {', '.join(SAMPLE_BY)}")
        if not cfg["files"]:
            raise ValueError("data.hf.files is empty: give the dataset's local files (text / json / parquet, "
                             "globs allowed), e.g. data.hf.files=[data/train.jsonl]")
        self.files = _resolve_files("files", cfg["files"])
        self.val_files = _resolve_files("val_files", cfg["val_files"]) if cfg["val_files"] else []
        self.cache_dir = cfg["cache_dir"]
        self.tokenizer = tokenizer
        if tokenizer is None:
            self.eod_id, self.vocab_size = BYTE_EOD, BYTE_EOD + 1
        else:
            self.eod_id = tokenizer.token_to_id(cfg["eod_token"])
            if self.eod_id is None:
                raise ValueError(f"data.hf.eod_token={cfg['eod_token']!r} is not a token of the tokenizer; name its "
                                 "end-of-document token (e.g. '</s>', '<|endoftext|>')")
            self.vocab_size = max(tokenizer.get_vocab_size(with_added_tokens=True), self.eod_id + 1)

    def _load(self, path: str, streaming: bool):
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # before datasets' first import reads it
        import datasets

        options = dict(sample_by=self.sample_by) if self.format == "text" else {}
        bars = datasets.is_progress_bar_enabled()
        datasets.disable_progress_bars()  # one bar per file and rank would bury the training log
        try:
            return datasets.load_dataset(self.format, data_files=[path], split="train", streaming=streaming,
                                         cache_dir=self.cache_dir, **options)
        finally:
            if bars:
                datasets.enable_progress_bars()

    def documents(self, path: str, streaming: bool) -> Iterator[list[str]]:
        """The text of ``path``'s documents in file order, in batches."""
        for batch in self._load(path, streaming).iter(batch_size=_TOKENIZE_BATCH):
            if self.text_field not in batch:  # a stream may not know its columns before its first rows
                raise ValueError(f"data.hf.text_field={self.text_field!r} is not a column of {path}; its columns: "
                                 f"{', '.join(batch)}")
            yield [text or "" for text in batch[self.text_field]]

    def token_ids(self, documents: Iterable[list[str]]) -> Iterator[list[int]]:
        """Each document's token ids followed by the end-of-document id."""
        for texts in documents:
            if self.tokenizer is None:
                encoded = [list(text.encode("utf-8")) for text in texts]
            else:
                encoded = [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]
            for ids in encoded:
                ids.append(self.eod_id)
                yield ids

    def samples(self, path: str, block_size: int, streaming: bool) -> Iterator[torch.Tensor]:
        """The packed samples of one file: int32 tensors of ``block_size + 1`` ids."""
        return pack(self.token_ids(self.documents(path, streaming)), block_size)


def pack(documents: Iterable[list[int]], block_size: int) -> Iterator[torch.Tensor]:
    """Cut the concatenated documents into ``block_size + 1``-token windows at a stride of
    ``block_size`` (consecutive windows share one token); the short tail is dropped."""
    buffer: list[int] = []
    start = 0
    for ids in documents:
        buffer.extend(ids)
        while len(buffer) - start >= block_size + 1:
            yield torch.tensor(buffer[start:start + block_size + 1], dtype=torch.int32)
            start += block_size
        if start > 1 << 16:  # drop what every yielded window has passed (kept short, cheap to slice)
            del buffer[:start]
            start = 0


def _pair(sample: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    sample = sample.long()
    return sample[:-1], sample[1:]


class PackedText(Dataset):
    """``data.hf.streaming: false``: every file read with ``datasets`` (its Arrow cache) and its
    packed samples held in memory (int32, 4 bytes a token), in file order. For data larger than
    memory use ``streaming: true`` or token shards."""

    def __init__(self, source: HFSource, files: list[str], block_size: int):
        self.vocab_size, self.eod_id = source.vocab_size, source.eod_id
        rows = [sample for path in files for sample in source.samples(path, block_size, streaming=False)]
        if not rows:
            raise ValueError(f"data.hf: {', '.join(files)} hold fewer than block_size + 1 = {block_size + 1} tokens")
        self.samples = torch.stack(rows)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return _pair(self.samples[index])

    def gather_batch(self, indices: list[int]) -> list[torch.Tensor]:
        """``[inputs, targets]`` of the samples at ``indices`` in one gather (the trainer's batch read,
        trainer/data/batched_read.py): what ``default_collate([self[i] for i in indices])`` gives."""
        rows = self.samples[torch.as_tensor(indices, dtype=torch.int64)]
        shape = (len(rows), rows.shape[1] - 1)
        return [batch_tensor(shape, torch.int64).copy_(rows[:, :-1]), batch_tensor(shape, torch.int64).copy_(rows[:, 1:])]


class StreamingPackedText(IterableDataset):
    """``data.hf.streaming: true``: the files streamed by ``datasets`` and packed as they are read.

    The trainer's shard protocol: ``n_shards`` (one per file) and ``shard_samples(shard, epoch)``
    (that file's samples, the same in every epoch: the trainer orders the shards). Iterated
    directly, it yields every shard in order, data-loader workers taking every n-th shard."""

    def __init__(self, source: HFSource, files: list[str], block_size: int):
        self.source, self.files, self.block_size = source, files, block_size
        self.vocab_size, self.eod_id = source.vocab_size, source.eod_id

    @property
    def n_shards(self) -> int:
        return len(self.files)

    def shard_samples(self, shard: int, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if not 0 <= shard < self.n_shards:
            raise IndexError(f"shard {shard} of a dataset with {self.n_shards} shards (one per file)")
        for sample in self.source.samples(self.files[shard], self.block_size, streaming=True):
            yield _pair(sample)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        worker = get_worker_info()
        first, step = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        for shard in range(first, self.n_shards, step):
            yield from self.shard_samples(shard, 0)
