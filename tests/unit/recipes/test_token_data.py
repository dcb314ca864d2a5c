"""Token shards: ``trainer prepare-text`` on a slice of the standard library's
text, the memmap datasets over its shards, the text recipes' source choice, and ``recipe=gpt
data.tokens=DIR`` training with bits per byte."""

from __future__ import annotations

import functools
import math
import os
import pickle
import shutil
import subprocess
import sys
import sysconfig
from collections import Counter

import numpy as np
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("tokenizers", reason="the optional extra 'data' (pip install -e .[data])")

from tests.support.helpers import REPO, new_trainer, read_metrics  # noqa: E402 (after the skip)
from trainer.recipes import prepare_text, token_shards  # noqa: E402
from trainer.recipes.text_data import text_datasets  # noqa: E402
from trainer.recipes.token_data import PackedBlocks, PackedStream, token_shard_datasets  # noqa: E402
from trainer.recipes.tokenizer_io import load_tokenizer, token_byte_lengths  # noqa: E402

pytestmark = pytest.mark.timeout(180)

VOCAB, SHARD_TOKENS, BLOCK = 320, 6000, 32


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """About 60 kB of the standard library's source, one document per file, and its shards."""
    root = tmp_path_factory.mktemp("tokens")
    inputs = root / "in"
    inputs.mkdir()
    stdlib, size = sysconfig.get_paths()["stdlib"], 0
    for name in sorted(os.listdir(stdlib)):
        if name.endswith(".py") and size < 60_000:
            shutil.copy(os.path.join(stdlib, name), inputs / name)
            size += os.path.getsize(inputs / name)
    out = str(root / "out")
    assert prepare_text.main([str(inputs), out, "--vocab-size", str(VOCAB), "--shard-tokens", str(SHARD_TOKENS),
                              "--val-fraction", "0.1"]) == 0
    documents = [open(inputs / name, encoding="utf-8", newline="").read() for name in sorted(os.listdir(inputs))]
    return root, out, documents


def _all_tokens(out: str, manifest: dict) -> np.ndarray:
    dtype = np.dtype(manifest["dtype"])
    files = [os.path.join(out, s["file"]) for s in manifest["train"] + manifest["val"]]
    return np.concatenate([np.fromfile(f, dtype=dtype) for f in files])


def test_prepare_text_writes_shards_manifest_and_round_trips(corpus):
    _, out, documents = corpus
    manifest = token_shards.read_manifest(out)  # also checks every file's size against the manifest
    assert manifest["dtype"] == "uint16" and manifest["vocab_size"] == VOCAB and manifest["documents"] == len(documents)
    assert len(manifest["train"]) >= 2 and len(manifest["val"]) == 1  # shards of SHARD_TOKENS, then the tail
    assert all(s["tokens"] <= SHARD_TOKENS and s["bytes"] == 2 * s["tokens"] for s in manifest["train"] + manifest["val"])
    counts = [s["tokens"] for s in manifest["train"] + manifest["val"]]
    assert sum(counts) == manifest["tokens"]
    assert counts[-1] == int(manifest["tokens"] * 0.1)  # the held-out tail
    tokens = _all_tokens(out, manifest)
    eod = manifest["eod_id"]
    assert int((tokens == eod).sum()) == len(documents) and tokens[-1] == eod  # every document ends with EOD
    tokenizer = load_tokenizer(os.path.join(out, "tokenizer.json"))
    ends = np.flatnonzero(tokens == eod)
    decoded = [tokenizer.decode(part.tolist()) for part in np.split(tokens, ends + 1)[:-1]]
    assert decoded == documents  # each document exactly (decode drops the EOD token)
    assert manifest["text_bytes"] == sum(len(d.encode("utf-8")) for d in documents)
    # bits per byte's denominator: the byte-length table counts every document's bytes exactly (EOD: 0)
    lengths = token_byte_lengths(tokenizer)
    assert lengths[eod] == 0 and int(lengths[tokens].sum()) == manifest["text_bytes"]


def test_prepare_text_with_a_given_tokenizer_and_uint32(corpus):
    root, out, _ = corpus
    again = str(root / "again")
    assert prepare_text.main([str(root / "in"), again, "--tokenizer", os.path.join(out, "tokenizer.json"),
                              "--dtype", "uint32", "--shard-tokens", "100000", "--val-fraction", "0"]) == 0
    manifest = token_shards.read_manifest(again)
    assert manifest["dtype"] == "uint32" and manifest["val"] == [] and len(manifest["train"]) == 1
    assert np.array_equal(_all_tokens(again, manifest), _all_tokens(out, token_shards.read_manifest(out)))
    with pytest.raises(ValueError, match="--dtype uint16 holds ids below 65536, but the vocabulary has 70000"):
        token_shards.shard_dtype("uint16", 70000)
    assert token_shards.shard_dtype("auto", 70000) == np.dtype("<u4")
    with pytest.raises(ValueError, match="--vocab-size 300 with --tokenizer"):
        prepare_text.prepare([str(root / "in")], again, vocab_size=300, tokenizer_path=os.path.join(out, "tokenizer.json"))
    with pytest.raises(ValueError, match="OUT_DIR '.*in' holds other files"):  # never deletes what is not its own
        prepare_text.prepare([str(root / "in")], str(root / "in"), tokenizer_path=os.path.join(out, "tokenizer.json"))


def test_packed_dataset_reads_windows_through_memmaps(corpus):
    _, out, _ = corpus
    train, val, manifest = token_shard_datasets(out, BLOCK)
    assert isinstance(train, PackedBlocks) and isinstance(val, PackedBlocks)
    per_shard = [(s["tokens"] - 1) // BLOCK for s in manifest["train"]]
    assert len(train) == sum(per_shard)
    # the last window of shard 1: its tokens straight from the file
    index = per_shard[0] + per_shard[1] - 1
    inputs, targets = train[index]
    shard1 = np.fromfile(os.path.join(out, manifest["train"][1]["file"]), dtype=np.uint16)
    start = (per_shard[1] - 1) * BLOCK
    assert inputs.dtype == torch.int64 and inputs.shape == (BLOCK,)
    assert inputs.tolist() == shard1[start: start + BLOCK].tolist() and targets.tolist() == shard1[start + 1: start + BLOCK + 1].tolist()
    assert all(isinstance(a, np.memmap) for a in train.parts.arrays())  # read through the page cache, never whole
    # a data-loader worker (or a spawned rank) gets the file names, not the data
    assert len(pickle.dumps(train)) < manifest["train"][0]["bytes"] / 4
    assert torch.equal(pickle.loads(pickle.dumps(train))[index][0], inputs)


def test_stream_shards_cover_every_sequence_once(corpus):
    _, out, _ = corpus
    blocks, _, manifest = token_shard_datasets(out, BLOCK)
    stream, _, _ = token_shard_datasets(out, BLOCK, stream=True)
    assert isinstance(stream, PackedStream) and stream.n_shards == len(manifest["train"])

    def key(sample):
        return tuple(sample[0].tolist()) + (int(sample[1][-1]),)
    expected = Counter(key(blocks[i]) for i in range(len(blocks)))
    for epoch in (0, 1):
        seen = Counter(key(s) for shard in range(stream.n_shards) for s in stream.shard_samples(shard, epoch))
        assert seen == expected
    first = [key(s) for s in stream.shard_samples(0, 0)]
    assert first != [key(s) for s in stream.shard_samples(0, 1)]  # reshuffled within the shard each epoch
    assert first == [key(s) for s in stream.shard_samples(0, 0)]  # deterministically
    assert Counter(key(s) for s in stream) == expected  # plain iteration (outside the trainer): every shard


def test_text_source_settings_are_checked(corpus, tmp_path):
    _, out, _ = corpus
    text = tmp_path / "a.txt"
    text.write_text("hello world\n" * 200)
    with pytest.raises(ValueError, match=r"data.path='.*a.txt' and data.tokens="):
        text_datasets(BLOCK, path=str(text), tokens=out)
    with pytest.raises(ValueError, match="data.source='words': choose one of text, tokens, hf"):
        text_datasets(BLOCK, source="words")
    with pytest.raises(FileNotFoundError, match="data.tokens='.*nowhere' is not a directory"):
        text_datasets(BLOCK, tokens=str(tmp_path / "nowhere"))
    with pytest.raises(FileNotFoundError, match="has no manifest.json"):
        text_datasets(BLOCK, tokens=str(tmp_path))
    with pytest.raises(ValueError, match="data.tokenizer='t.json': read only with data.source=hf"):
        text_datasets(BLOCK, tokenizer="t.json")
    with pytest.raises(ValueError, match="data.stream='yes': give true or false"):
        text_datasets(BLOCK, stream="yes")
    data = text_datasets(BLOCK, path=str(text), stream=True)
    assert data.vocab_size == 256 and data.token_bytes is None and isinstance(data.train, PackedStream)
    assert sum(1 for _ in data.train) == (int(len(text.read_bytes()) * 0.95) - 1) // BLOCK
    tokens = text_datasets(BLOCK, tokens=out)
    assert tokens.vocab_size == VOCAB and len(tokens.token_bytes) == VOCAB


def test_hf_source_calls_recipes_hf_text(corpus, monkeypatch):
    """data.source=hf: trainer.recipes.hf_text.hf_text_datasets(data_cfg, block_size, tokenizer), imported only then."""
    import importlib.util
    import types

    _, out, _ = corpus
    if importlib.util.find_spec("trainer.recipes.hf_text") is None:  # until recipes/hf_text.py exists: a clear error
        with pytest.raises(ValueError, match="data.source=hf needs recipes/hf_text.py"):
            text_datasets(BLOCK, source="hf", hf={"files": ["a.json"]})
    calls = []

    def hf_text_datasets(data_cfg, block_size, tokenizer):
        calls.append((data_cfg, block_size, tokenizer))
        return "train", "val"
    monkeypatch.setitem(sys.modules, "trainer.recipes.hf_text", types.SimpleNamespace(hf_text_datasets=hf_text_datasets))
    data = text_datasets(BLOCK, source="hf", stream=True, tokenizer=os.path.join(out, "tokenizer.json"),
                         hf={"format": "json", "files": ["a.json"]})
    (cfg, block_size, tokenizer), = calls
    assert (data.train, data.val, block_size) == ("train", "val", BLOCK)
    assert cfg.hf.files == ["a.json"] and cfg.hf.streaming is True  # data.stream=true is hf's streaming
    assert tokenizer.get_vocab_size() == VOCAB == data.vocab_size and len(data.token_bytes) == VOCAB
    assert text_datasets(BLOCK, source="hf", hf={"files": ["a.json"]}).vocab_size == 256  # no tokenizer: bytes
    assert calls[-1][2] is None


def test_validation_bits_per_byte_is_exact(corpus, tmp_path):
    """val/bits_per_byte on token data = the validation targets' nats / their UTF-8 bytes / ln 2."""
    from trainer.recipes.gpt import GPTModule

    _, out, _ = corpus
    module = GPTModule(optimizer=functools.partial(torch.optim.AdamW, lr=3e-3), tokens=out, block_size=BLOCK,
                       layers=1, heads=2, width=32)
    result = new_trainer(tmp_path, max_steps=2, batch_size=8, val_every_n_steps=2).fit(module)
    lengths = torch.as_tensor(module.text_data().token_bytes)
    nats = num_bytes = 0.0
    module.eval()
    with torch.no_grad():
        for inputs, targets in torch.utils.data.DataLoader(module.val_dataset(), batch_size=16):
            logits = module.model(inputs)
            nats += float(F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum"))
            num_bytes += float(lengths[targets].sum())
    assert result["val/bits_per_byte"] == pytest.approx(nats / num_bytes / math.log(2), rel=1e-6)
    tokens = len(module.val_dataset()) * BLOCK
    assert result["val/loss"] == pytest.approx(nats / tokens, rel=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", ["gpt", "llama"])
def test_text_recipes_train_on_token_shards_from_the_command_line(corpus, tmp_path, recipe):
    _, out, _ = corpus
    extra = ["module.kv_heads=1"] if recipe == "llama" else []  # grouped-query attention: 2 query heads share 1
    result = subprocess.run(
        [sys.executable, "train.py", f"recipe={recipe}", *extra, f"data.tokens={out}", "trainer.max_steps=3",
         "trainer.val_every_n_steps=3", "trainer.log_every_n_steps=1", "data.block_size=32", "module.layers=1",
         "module.width=32", "module.heads=2", "data.batch_size=8", "logger=[jsonl]", "trainer.progress_bar=false",
         f"hydra.run.dir={tmp_path}"],
        cwd=REPO, capture_output=True, text=True, timeout=150, env=dict(os.environ, PYTHONPATH=REPO),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_metrics(str(tmp_path))
    assert len([r for r in rows if "train/loss" in r]) == 3
    bpb = [r["val/bits_per_byte"] for r in rows if "val/bits_per_byte" in r]
    # a fresh model predicts about uniformly over the 320 tokens: ~ln(320) nats per ~2 bytes per token
    assert len(bpb) == 1 and 1.0 < bpb[0] < math.log2(VOCAB)
