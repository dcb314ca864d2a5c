"""A small decoder-only transformer on real text: ``python train.py`` (the default recipe).

With no data settings it trains on the bytes of text that ships with Python itself (the standard
library's own source files), so it runs offline; ``data.path`` trains on the bytes of your UTF-8
text file, ``data.tokens`` on token shards (``trainer prepare-text``), ``data.source=hf``
on a local Hugging Face dataset: ``recipes/text_data.py`` chooses. Tensor and sequence parallel
(``GPTModule.tensor_parallel_plan``): ``python train.py strategy=nd strategy.tp=2 trainer.devices=2``.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import nn

from trainer.recipes.text_data import python_stdlib_text  # noqa: F401 (its old home)
from trainer.recipes import tp_plans
from trainer.recipes.text_module import TextRecipe
from trainer.recipes.token_data import PackedBlocks
from trainer import TrainModule


class ByteBlocks(PackedBlocks):
    """Non-overlapping blocks of ``block_size + 1`` bytes of one tensor; sample i is (input,
    next-byte target). (``recipes/token_data.py``'s packing, kept under its old name.)"""

    def __init__(self, data: torch.Tensor, block_size: int):
        super().__init__([data.numpy()], block_size)


class CausalSelfAttention(nn.Module):
    """Causal multi-head self-attention. q, k and v are separate projections so tensor parallel can
    split each by heads (a fused projection's column split would give one rank all of q and part of
    k); checkpoints of the fused ``qkv`` layout still load (``split_fused_qkv``)."""

    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.head_dim = heads, width // heads
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.proj = nn.Linear(width, width)
        self.dropout = dropout
        self.register_load_state_dict_pre_hook(split_fused_qkv)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, _ = x.shape
        # -1 heads: under tensor parallel each rank holds heads / tp of them.
        q, k, v = (proj(x).view(batch, time, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(out.transpose(1, 2).reshape(batch, time, -1))


def split_fused_qkv(module: nn.Module, state_dict: dict, prefix: str, *_: object) -> None:
    """Load-state-dict pre-hook: an older checkpoint's fused ``qkv.weight`` / ``qkv.bias`` (rows q,
    then k, then v) become the ``q``, ``k`` and ``v`` entries."""
    for kind in ("weight", "bias"):
        fused = state_dict.pop(f"{prefix}qkv.{kind}", None)
        if fused is not None:
            for name, part in zip(("q", "k", "v"), fused.chunk(3, dim=0)):
                state_dict[f"{prefix}{name}.{kind}"] = part


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


class GPTModule(TextRecipe, TrainModule):
    """Next-token prediction with a small GPT, on bytes or on token shards.

    Args:
        data_path: a UTF-8 text file; None = the Python standard library's source text.
        max_bytes: how much of the default text to use.
        block_size: context length in tokens (bytes for the byte text).
        val_fraction: the tail of the byte text held out for validation (token shards bring their split).
        tokens / source / stream / tokenizer / hf: the other data sources (``recipes/text_data.py``);
            the vocabulary (embedding and head size) comes from the data: 256 for bytes.
        layers / heads / width / dropout: the model (dropout 0 keeps CPU runs deterministic).
    """

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
        tokens: str | None = None,
        source: str | None = None,
        stream: bool = False,
        tokenizer: str | None = None,
        hf: dict | None = None,
    ):
        super().__init__(optimizer, scheduler)
        self.init_text_data(block_size, max_bytes, val_fraction, data_path, tokens, source, stream, tokenizer, hf)
        if width % heads:
            raise ValueError(f"module.width={width} must be divisible by module.heads={heads}")
        self.model_args = dict(block_size=block_size, layers=layers, heads=heads, width=width, dropout=dropout)
        self.model: GPT | None = None

    def configure_model(self) -> None:
        # Built on each rank (after seeding), so the launcher process never holds the weights.
        if self.model is None:
            self.model = GPT(vocab_size=self.vocab_size, **self.model_args)

    def block_classes(self) -> tuple[type[nn.Module], ...]:
        return (Block,)

    def pipeline_layers(self) -> list[nn.Module]:
        # strategy=pipeline: embedding, each block, then final norm + head, cut into stages.
        return [Embedding(self.model), *self.model.blocks, nn.Sequential(self.model.norm, self.model.head)]

    def tensor_parallel_plan(self) -> dict:
        """Heads and MLP width split over the ``tp`` ranks, the residual stream sharded along the
        sequence between them (``recipes/tp_plans.py``), the position embedding split along the
        positions so it adds to the token embedding's sequence shard, the head's logits sharded over
        the vocabulary (loss parallel) unless the strategy turns loss parallel off."""
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

        block = "model.blocks.*."
        return {
            "model.token_embedding": tp_plans.token_embedding(),
            "model.position_embedding": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0)),
            block + "norm1": SequenceParallel(),
            block + "attention": tp_plans.gather_sequence(),
            block + "attention.q": ColwiseParallel(),
            block + "attention.k": ColwiseParallel(),
            block + "attention.v": ColwiseParallel(),
            block + "attention.proj": tp_plans.block_output(),
            block + "norm2": SequenceParallel(),
            block + "mlp": tp_plans.gather_sequence(),
            block + "mlp.0": ColwiseParallel(),
            block + "mlp.2": tp_plans.block_output(),  # mlp.3 (dropout) then acts on the sequence shard
            "model.norm": SequenceParallel(),
            "model.head": tp_plans.vocabulary_head(tp_plans.loss_parallel_enabled(self)),
        }

    def check_tensor_parallel(self, tp: int) -> None:
        tp_plans.check_degree(tp, heads=self.model_args["heads"], block_size=self.block_size)

    def pipeline_loss(self, logits: torch.Tensor, batch):
        _, targets = batch
        loss = tp_plans.cross_entropy(logits, targets)
        if self.training:  # as training_step (num_tokens: tokens/s, and loss_normalization=tokens)
            return {"loss": loss, "num_tokens": targets.numel()}
        return self.pipeline_eval_outputs(loss)  # as validation_step

    def init_weights(self, module: nn.Module) -> None:
        # Owning initialisation makes strategy.meta_init=true give the same weights as an eager build.
        init_gpt_weights(module)

    def _loss(self, batch):
        inputs, targets = batch
        logits = self.model(inputs)  # tensor parallel with loss parallel: a vocabulary-sharded DTensor
        loss = tp_plans.cross_entropy(logits, targets)
        return loss, targets.numel()

    def training_step(self, batch, batch_idx):
        loss, num_tokens = self._loss(batch)
        return {"loss": loss, "num_tokens": num_tokens}

    def validation_step(self, batch, batch_idx):
        loss, _ = self._loss(batch)
        return self.validation_outputs(loss, batch[1])
