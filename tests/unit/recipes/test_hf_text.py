"""data.source=hf (recipes/hf_text.py): local text / json / parquet files read with ``datasets``,
tokenized on the fly (bytes or a ``tokenizers`` tokenizer) and packed with end-of-document tokens;
the map-style dataset and the stream (the trainer's shard protocol) hold the same samples."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import DataLoader

from trainer.recipes.hf_text import BYTE_EOD, hf_text_datasets

pytestmark = pytest.mark.timeout(120)
BLOCK = 8
DOCUMENTS = [  # three files, documents of various lengths (one shorter than a block, one empty, non-ASCII)
    ["The first document of the first file.", "short", "", "ünïcødé text, a third document"],
    ["File two holds one longer document: " + "abcdefghij" * 5],
    ["x" * 3, "Another document in the last file, long enough to fill several blocks of eight."],
]


def write_jsonl(directory, documents=DOCUMENTS, field="text") -> list[str]:
    paths = []
    for index, docs in enumerate(documents):
        path = directory / f"part-{index}.jsonl"
        path.write_text("".join(json.dumps({field: doc, "id": i}) + "\n" for i, doc in enumerate(docs)))
        paths.append(str(path))
    return paths


def hf_block(tmp_path, **settings) -> dict:
    return {"hf": {"format": "json", "files": write_jsonl(tmp_path), "cache_dir": str(tmp_path / "cache"), **settings}}


def as_lists(samples) -> list[list[int]]:
    return [torch.cat([x[:1], y]).tolist() for x, y in samples]


@pytest.fixture(scope="module")
def tokenizer():
    """A small byte-level BPE trained here (offline) with an end-of-document token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([doc for docs in DOCUMENTS for doc in docs] * 3, trainer)
    return tok


def test_bytes_are_packed_with_end_of_document_tokens(tmp_path):
    train, val = hf_text_datasets(hf_block(tmp_path), BLOCK)
    assert val is None and train.vocab_size == 257 and train.eod_id == BYTE_EOD
    samples = [train[i] for i in range(len(train))]
    x, y = samples[0]
    assert x.shape == y.shape == (BLOCK,) and x.dtype == torch.long and torch.equal(x[1:], y[:-1])
    # Consecutive windows share one token; within a file they rebuild its documents + end tokens.
    first_file = [b for doc in DOCUMENTS[0] for b in [*doc.encode("utf-8"), BYTE_EOD]]
    per_file = len(first_file) // BLOCK - (len(first_file) % BLOCK == 0)  # windows of BLOCK + 1 at stride BLOCK
    rebuilt = as_lists(samples[:per_file])
    flat = rebuilt[0] + [t for window in rebuilt[1:] for t in window[1:]]
    assert flat == first_file[:len(flat)] and len(first_file) - len(flat) <= BLOCK
    assert flat.count(BYTE_EOD) >= 3  # the documents are separated
    total = sum((len(b) - 1) // BLOCK for b in ([t for d in docs for t in [*d.encode(), 0]] for docs in DOCUMENTS))
    assert len(train) == total  # no window crosses a file


@pytest.mark.parametrize("with_tokenizer", [False, True])
def test_map_style_and_stream_hold_the_same_samples_and_shards_cover_each_once(tmp_path, tokenizer, with_tokenizer):
    tok = tokenizer if with_tokenizer else None
    mapped, _ = hf_text_datasets(hf_block(tmp_path), BLOCK, tok)
    stream, _ = hf_text_datasets(hf_block(tmp_path, streaming=True), BLOCK, tok)
    expected = as_lists(mapped[i] for i in range(len(mapped)))
    assert isinstance(stream, torch.utils.data.IterableDataset) and stream.n_shards == 3
    assert as_lists(stream) == expected
    by_shard = [as_lists(stream.shard_samples(shard, epoch=0)) for shard in range(stream.n_shards)]
    assert all(by_shard) and sum(by_shard, []) == expected  # every sample in exactly one shard, in order
    assert as_lists(stream.shard_samples(1, epoch=5)) == by_shard[1]  # a shard's samples do not change
    if with_tokenizer:
        eod = tokenizer.token_to_id("<|endoftext|>")
        assert mapped.eod_id == eod and mapped.vocab_size == tokenizer.get_vocab_size()
        assert max(max(s) for s in expected) < mapped.vocab_size and any(eod in s for s in expected)
        assert len(expected) < len(hf_text_datasets(hf_block(tmp_path), BLOCK)[0])  # BPE: fewer tokens
    else:  # two data-loader workers take every other shard between them: each sample once
        loaded = DataLoader(stream, batch_size=None, num_workers=2)
        assert sorted(as_lists(loaded)) == sorted(expected)


def test_text_and_parquet_files_and_a_validation_set(tmp_path):
    import pandas

    docs = DOCUMENTS[0] + DOCUMENTS[2]
    (tmp_path / "one.txt").write_text("\n\n".join(docs))
    pandas.DataFrame({"body": docs}).to_parquet(tmp_path / "one.parquet")
    paragraphs, _ = hf_text_datasets({"format": "text", "files": [str(tmp_path / "one.txt")], "sample_by": "paragraph",
                                      "cache_dir": str(tmp_path / "c1")}, BLOCK)
    parquet, val = hf_text_datasets({"format": "parquet", "files": str(tmp_path / "*.parquet"), "text_field": "body",
                                     "val_files": [str(tmp_path / "one.parquet")], "cache_dir": str(tmp_path / "c2")}, BLOCK)
    # "" is no paragraph of the text file: the parquet file has one more (empty) document
    assert as_lists(paragraphs[i] for i in range(3)) == as_lists(parquet[i] for i in range(3))
    assert len(val) == len(parquet)


def test_bad_settings_are_clear_errors(tmp_path, tokenizer):
    missing = str(tmp_path / "no" / "such.jsonl")
    with pytest.raises(FileNotFoundError, match=f"data.hf.files: '{missing}' is not a file"):
        hf_text_datasets({"hf": {"files": [missing]}}, BLOCK)
    with pytest.raises(FileNotFoundError, match=r"data.hf.val_files: '.*nothing-\*.json'"):
        hf_text_datasets(hf_block(tmp_path, val_files=str(tmp_path / "nothing-*.json")), BLOCK)
    with pytest.raises(ValueError, match="data.hf.files is empty"):
        hf_text_datasets({"hf": {"files": []}}, BLOCK)
    with pytest.raises(ValueError, match="data.hf.format='csv' is not one of text, json, parquet"):
        hf_text_datasets(hf_block(tmp_path, format="csv"), BLOCK)
    with pytest.raises(ValueError, match="data.hf.fromat is not a setting"):
        hf_text_datasets(hf_block(tmp_path, fromat="json"), BLOCK)
    with pytest.raises(ValueError, match="data.hf.sample_by='line' applies to data.hf.format=text only"):
        hf_text_datasets(hf_block(tmp_path, sample_by="line"), BLOCK)
    with pytest.raises(ValueError, match="data.hf.text_field='content' is not a column of .*part-0.jsonl; its columns: text, id"):
        hf_text_datasets(hf_block(tmp_path, text_field="content"), BLOCK)
    with pytest.raises(ValueError, match="data.hf.text_field='body' is not a column of .*one.txt; its columns: text"):
        (tmp_path / "one.txt").write_text("some text")
        list(hf_text_datasets({"format": "text", "files": [str(tmp_path / "one.txt")], "text_field": "body",
                               "streaming": True}, BLOCK)[0])
    with pytest.raises(ValueError, match="data.hf.eod_token='</s>' is not a token of the tokenizer"):
        hf_text_datasets(hf_block(tmp_path, eod_token="</s>"), BLOCK, tokenizer)
    with pytest.raises(ValueError, match="needs a data.hf block"):
        hf_text_datasets({"path": None, "block_size": 8}, BLOCK)
