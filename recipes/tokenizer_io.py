"""Tokenizers for the text recipes: train a byte-level BPE offline, load a tokenizer.json, and the
token -> UTF-8 byte-length table that bits per byte needs.

Needs the optional extra ``data`` (``pip install -e .[data]``: Hugging Face ``tokenizers``).
"""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Sequence

import numpy as np

EOD_TOKEN = "<|endoftext|>"  # the end-of-document special token a trained tokenizer gets (GPT-2's name)

log = logging.getLogger(__name__)


def train_byte_level_bpe(files: Sequence[str], vocab_size: int):
    """A byte-level BPE tokenizer (GPT-2's scheme: every byte has a token, so any text encodes and
    decodes exactly) trained on ``files``, with ``EOD_TOKEN`` as a special token. Offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 1:
        raise ValueError(f"--vocab-size {vocab_size}: a byte-level BPE needs at least {len(alphabet) + 1} "
                         f"(the {len(alphabet)} bytes and the end-of-document token)")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOD_TOKEN], initial_alphabet=alphabet,
                                  show_progress=False)
    tokenizer.train(list(files), trainer)
    return tokenizer


def load_tokenizer(path: str):
    """A ``tokenizers.Tokenizer`` from a tokenizer.json file."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(path)
    except Exception as error:  # tokenizers raises a bare Exception for a bad file
        raise ValueError(f"cannot read the tokenizer {path!r}: {error}") from error


def eod_id(tokenizer) -> int:
    """The id of the end-of-document token: ``EOD_TOKEN`` or another special token named like one."""
    for name in (EOD_TOKEN, "</s>", "<eos>", "<|end_of_text|>", "<eod>"):
        token_id = tokenizer.token_to_id(name)
        if token_id is not None:
            return token_id
    raise ValueError(f"the tokenizer has no end-of-document token (looked for {EOD_TOKEN!r}, '</s>', '<eos>', "
                     "'<|end_of_text|>', '<eod>'); add one as a special token")


@lru_cache(maxsize=1)
def _byte_level_decoding() -> dict[str, int]:
    """GPT-2's printable character -> byte table (the inverse of its bytes_to_unicode)."""
    from tokenizers import pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # bytes_to_unicode: the printable bytes map to themselves, the others to 256, 257, ... in byte order.
    printable = [b for b in range(256) if chr(b) in alphabet and (33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255)]
    table, shifted = {chr(b): b for b in printable}, 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


def token_byte_lengths(tokenizer) -> np.ndarray:
    """``lengths[id]`` = the UTF-8 bytes token ``id`` stands for (special tokens: 0), as int64.

    Exact for byte-level tokenizers (a token's string spells its bytes). For others each token is
    decoded alone, which can miscount merged spaces or partial characters: a warning says so.
    """
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    lengths = np.zeros(max(vocab.values()) + 1, dtype=np.int64)
    special = {token.content for token in tokenizer.get_added_tokens_decoder().values() if token.special}
    decoding = _byte_level_decoding()
    byte_level = all(ch in decoding for name in vocab if name not in special for ch in name)
    if not byte_level:
        log.warning("the tokenizer is not byte-level: bits per byte counts each token's bytes by decoding it "
                    "alone, which is approximate")
    for name, token_id in vocab.items():
        if name in special:
            continue
        lengths[token_id] = len(name) if byte_level else len(tokenizer.decode([token_id]).encode("utf-8"))
    return lengths
