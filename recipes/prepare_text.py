"""Tokenize text files into token shards for ``python train.py recipe=gpt data.tokens=OUT_DIR``.

    trainer prepare-text INPUT... OUT_DIR [--vocab-size N | --tokenizer tokenizer.json]
        [--shard-tokens N] [--dtype auto|uint16|uint32] [--val-fraction F] [--suffixes .txt,.md,.py]

Each input file is one document; a directory stands for the files under it (recursively) whose
names end in one of ``--suffixes``, in sorted path order. Without ``--tokenizer`` a byte-level BPE
of ``--vocab-size`` tokens is trained on the inputs first (Hugging Face ``tokenizers``, offline).
Every document is followed by the end-of-document token. Tokens are written streaming (each file
is read and encoded in chunks of about 1 MiB cut at line ends, so no pre-token crosses a chunk end)
into ``train_NNNNN.bin`` shards of ``--shard-tokens`` tokens; the last ``--val-fraction`` of the
token stream then moves to ``val_NNNNN.bin`` (the held-out tail, as the byte-level recipe holds
out the tail of its text). OUT_DIR gets the shards, ``tokenizer.json`` and ``manifest.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Iterator, Sequence

import numpy as np

from trainer.recipes import token_shards
from trainer.recipes.tokenizer_io import eod_id, load_tokenizer, train_byte_level_bpe

DEFAULT_VOCAB = 4096
_CHUNK_BYTES = 1 << 20
_OWN_FILES = ("manifest.json", "tokenizer.json")


def input_files(inputs: Sequence[str], suffixes: Sequence[str]) -> list[str]:
    """The documents: files as given, directories expanded (recursively, sorted) to their files
    ending in one of ``suffixes``."""
    files = []
    for item in inputs:
        if os.path.isfile(item):
            files.append(item)
        elif os.path.isdir(item):
            found = sorted(os.path.join(root, name) for root, _, names in os.walk(item) for name in names
                           if name.endswith(tuple(suffixes)))
            if not found:
                raise ValueError(f"{item!r}: a directory with no files ending in {', '.join(suffixes)} (see --suffixes)")
            files.extend(found)
        else:
            raise FileNotFoundError(f"input {item!r} is not a file or a directory")
    return files


def text_chunks(path: str) -> Iterator[str]:
    """``path``'s UTF-8 text in pieces of about ``_CHUNK_BYTES``, each ending at a line end."""
    with open(path, encoding="utf-8", newline="") as handle:  # newline="": the text exactly as stored
        lines, size = [], 0
        try:
            for line in handle:
                lines.append(line)
                size += len(line)
                if size >= _CHUNK_BYTES:
                    yield "".join(lines)
                    lines, size = [], 0
        except UnicodeDecodeError as error:
            raise ValueError(f"{path}: not UTF-8 text ({error})") from error
        if lines:
            yield "".join(lines)


def _clear_out_dir(out_dir: str) -> None:
    """Create ``out_dir``, or empty it of an earlier run's output; anything else in it is an error."""
    os.makedirs(out_dir, exist_ok=True)
    names = os.listdir(out_dir)
    ours = [n for n in names if n in _OWN_FILES or (n.startswith(("train_", "val_")) and n.endswith(".bin"))]
    if len(ours) != len(names):
        other = sorted(set(names) - set(ours))
        raise ValueError(f"OUT_DIR {out_dir!r} holds other files ({', '.join(other[:3])}...); give an empty or new directory")
    for name in ours:
        os.remove(os.path.join(out_dir, name))


def prepare(inputs: Sequence[str], out_dir: str, vocab_size: int | None = None, tokenizer_path: str | None = None,
            shard_tokens: int = 1 << 24, dtype: str = "auto", val_fraction: float = 0.05,
            suffixes: Sequence[str] = (".txt", ".md", ".py")) -> dict:
    """Write the shards, tokenizer and manifest; returns the manifest."""
    if not 0 <= val_fraction < 1:
        raise ValueError(f"--val-fraction {val_fraction}: give a number in [0, 1)")
    if tokenizer_path is not None and vocab_size is not None:
        raise ValueError(f"--vocab-size {vocab_size} with --tokenizer {tokenizer_path}: the tokenizer fixes the "
                         "vocabulary; give one of them")
    files = input_files(inputs, suffixes)
    if not files:
        raise ValueError("no input files")
    if tokenizer_path is None:
        tokenizer = train_byte_level_bpe(files, vocab_size or DEFAULT_VOCAB)
    else:
        tokenizer = load_tokenizer(tokenizer_path)
    _clear_out_dir(out_dir)  # after loading: the tokenizer may be OUT_DIR/tokenizer.json of an earlier run
    eod = eod_id(tokenizer)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    shard_type = token_shards.shard_dtype(dtype, vocab)
    train = token_shards.ShardWriter(out_dir, "train", shard_type, shard_tokens)
    text_bytes = 0
    for path in files:
        for chunk in text_chunks(path):
            text_bytes += len(chunk.encode("utf-8"))
            train.write(np.asarray(tokenizer.encode(chunk, add_special_tokens=False).ids, dtype=np.int64))
        train.write(np.array([eod]))
    total = sum(shard["tokens"] for shard in train.shards)
    val = token_shards.ShardWriter(out_dir, "val", shard_type, shard_tokens)
    token_shards.split_tail(out_dir, train, val, int(total * val_fraction))
    tokenizer.save(os.path.join(out_dir, "tokenizer.json"))
    manifest = dict(dtype=shard_type.name, vocab_size=vocab, eod_id=eod, tokenizer="tokenizer.json",
                    documents=len(files), text_bytes=text_bytes, tokens=total, train=train.shards, val=val.shards)
    token_shards.write_manifest(out_dir, **manifest)
    return manifest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trainer prepare-text", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    parser.add_argument("inputs", nargs="+", metavar="INPUT", help="text files or directories (each file is one document)")
    parser.add_argument("out_dir", metavar="OUT_DIR", help="where the shards, tokenizer.json and manifest.json go "
                        "(new, empty, or an earlier prepare_text output, which is replaced)")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help=f"train a byte-level BPE of this many tokens (default {DEFAULT_VOCAB}; at least 257)")
    parser.add_argument("--tokenizer", default=None, help="use this tokenizer.json instead of training one")
    parser.add_argument("--shard-tokens", type=int, default=1 << 24, help="tokens per shard file (default 16777216)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "uint16", "uint32"),
                        help="token id type; auto = uint16 when the vocabulary has <= 65536 tokens, else uint32")
    parser.add_argument("--val-fraction", type=float, default=0.05,
                        help="the tail of the token stream held out for validation (default 0.05; 0 = none)")
    parser.add_argument("--suffixes", default=".txt,.md,.py",
                        help="file name endings read from directory inputs, comma-separated (default .txt,.md,.py)")
    args = parser.parse_args(argv)
    try:
        manifest = prepare(args.inputs, args.out_dir, args.vocab_size, args.tokenizer, args.shard_tokens, args.dtype,
                           args.val_fraction, tuple(s for s in args.suffixes.split(",") if s))
    except (ValueError, FileNotFoundError) as error:
        print(f"prepare_text: error: {error}", file=sys.stderr)
        return 2
    counts = [sum(s["tokens"] for s in manifest[split]) for split in ("train", "val")]
    print(f"{manifest['documents']} documents, {manifest['text_bytes']} bytes -> {manifest['tokens']} tokens "
          f"({manifest['dtype']}, vocabulary {manifest['vocab_size']}): train {counts[0]} in {len(manifest['train'])} "
          f"shards, val {counts[1]} in {len(manifest['val'])}; {args.out_dir}/manifest.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
