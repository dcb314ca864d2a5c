"""A small decoder-only transformer on bytes of real text: ``python train.py`` (the default recipe).

With ``data.path`` unset it trains on text that ships with Python itself (the standard library's
own source files), so it runs offline; point ``data.path`` at any UTF-8 text file to use yours.
"""

from __future__ import annotations

import math
import os
import sysconfig

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from trainer import TrainModule


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


def check_text_data(data_path: str | None, val_fraction: float) -> None:
    """Refuse a missing ``data.path`` or a validation fraction outside (0, 1) before any training
    (the data hooks of this recipe and of recipes/llama.py read them)."""
    if data_path is not None and not os.path.isfile(data_path):
        raise FileNotFoundError(f"data.path={data_path!r} is not a file; give a UTF-8 text file, or null for the built-in text")
    if not 0 < val_fraction < 1:
        raise ValueError(f"module.val_fraction must be in (0, 1), got {val_fraction}")


class ByteBlocks(Dataset):
    """Non-overlapping blocks of ``block_size + 1`` bytes; sample i is (input, next-byte target)."""

    def __init__(self, data: torch.Tensor, block_size: int):
        self.data = data
        self.block_size = block_size

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.block_size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = index * self.block_size
        chunk = self.data[start : start + self.block_size + 1].long()
        return chunk[:-1], chunk[1:]


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=-1)
        q, k, v = (t.view(batch, time, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(out.transpose(1, 2).reshape(batch, time, width))


class Block(nn.Module):
    """Pre-norm transformer block (the unit FSDP and activation checkpointing wrap)."""

    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attention = CausalSelfAttention(width, heads, dropout)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def init_gpt_weights(module: nn.Module) -> None:
    """GPT-2's initialisation of the parameters ``module`` holds directly."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.LayerNorm):
        module.reset_parameters()


class GPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, layers: int, heads: int, width: int, dropout: float):
        super().__init__()
        self.block_size = block_size
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.position_embedding = nn.Embedding(block_size, width)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)
        self.apply(init_gpt_weights)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.token_embedding(tokens) + self.position_embedding(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class Embedding(nn.Module):
    """Token + position embedding: the first pipeline layer (holds the GPT's own embeddings)."""

    def __init__(self, gpt: GPT):
        super().__init__()
        self.token_embedding, self.position_embedding = gpt.token_embedding, gpt.position_embedding

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.token_embedding(tokens) + self.position_embedding(positions)


class GPTModule(TrainModule):
    """Next-byte prediction with a small GPT.

    Args:
        data_path: a UTF-8 text file; None = the Python standard library's source text.
        max_bytes: how much of the default text to use.
        block_size: context length in bytes.
        val_fraction: the tail of the text held out for validation.
        layers / heads / width / dropout: the model (dropout 0 keeps CPU runs deterministic).
    """

    vocab_size = 256

    def __init__(
        self,
        optimizer=None,
        scheduler=None,
        data_path: str | None = None,
        max_bytes: int = 1_000_000,
        block_size: int = 64,
        val_fraction: float = 0.05,
        layers: int = 2,
        heads: int = 4,
        width: int = 128,
        dropout: float = 0.0,
    ):
        super().__init__(optimizer, scheduler)
        check_text_data(data_path, val_fraction)
        if width % heads:
            raise ValueError(f"module.width={width} must be divisible by module.heads={heads}")
        self.data_path, self.max_bytes, self.block_size, self.val_fraction = data_path, max_bytes, block_size, val_fraction
        self.model_args = dict(
            vocab_size=self.vocab_size, block_size=block_size, layers=layers, heads=heads, width=width, dropout=dropout
        )
        self.model: GPT | None = None

    def configure_model(self) -> None:
        # Built on each rank (after seeding), so the launcher process never holds the weights.
        if self.model is None:
            self.model = GPT(**self.model_args)

    def block_classes(self) -> tuple[type[nn.Module], ...]:
        return (Block,)

    def pipeline_layers(self) -> list[nn.Module]:
        # strategy=pipeline: embedding, each block, then final norm + head, cut into stages.
        return [Embedding(self.model), *self.model.blocks, nn.Sequential(self.model.norm, self.model.head)]

    def pipeline_loss(self, logits: torch.Tensor, batch):
        _, targets = batch
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        if self.training:  # as training_step (num_tokens: tokens/s, and loss_normalization=tokens)
            return {"loss": loss, "num_tokens": targets.numel()}
        return {"loss": loss, "bits_per_byte": loss / math.log(2)}  # as validation_step

    def init_weights(self, module: nn.Module) -> None:
        # Owning initialisation makes strategy.meta_init=true give the same weights as an eager build.
        init_gpt_weights(module)

    def _tokens(self) -> torch.Tensor:
        if self.data_path is None:
            raw = python_stdlib_text(self.max_bytes)
        else:
            with open(self.data_path, "rb") as handle:
                raw = handle.read()
        tokens = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        if len(tokens) < 4 * (self.block_size + 1):
            raise ValueError(f"the text has {len(tokens)} bytes; need at least {4 * (self.block_size + 1)} for block_size={self.block_size}")
        return tokens

    def _split(self) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = self._tokens()
        cut = int(len(tokens) * (1 - self.val_fraction))
        return tokens[:cut], tokens[cut:]

    def train_dataset(self) -> Dataset:
        return ByteBlocks(self._split()[0], self.block_size)

    def val_dataset(self) -> Dataset:
        return ByteBlocks(self._split()[1], self.block_size)

    def _loss(self, batch):
        inputs, targets = batch
        logits = self.model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return loss, targets.numel()

    def training_step(self, batch, batch_idx):
        loss, num_tokens = self._loss(batch)
        return {"loss": loss, "num_tokens": num_tokens}

    def validation_step(self, batch, batch_idx):
        loss, _ = self._loss(batch)
        # bits per byte: the loss in base 2, comparable across tokenisers
        return {"loss": loss, "bits_per_byte": loss / math.log(2)}
