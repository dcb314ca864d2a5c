"""A Llama-style decoder (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention): ``python train.py recipe=llama``.

The architecture of Llama 2/3 at any size from config; the data, steps and metrics are the gpt
recipe's (bytes of text, loss and bits per byte), shared with it rather than copied. The model the
GPU throughput figures are measured on: a larger size is one command line (conf/recipe/llama.yaml).
Tensor and sequence parallel (torchtitan's plan, ``LlamaModule.tensor_parallel_plan``):
``python train.py recipe=llama strategy=nd strategy.tp=2 trainer.devices=2``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from trainer.recipes import gpt, tp_plans
from trainer.recipes.text_module import TextRecipe
from trainer import TrainModule


def rope_angles(seq_len: int, head_dim: int, theta: float, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) of the rotary angles, each ``[seq_len, head_dim // 2]`` in fp32: position m turns
    the pair (i, i + head_dim/2) by m * theta^(-2i/head_dim). Computed per forward (cheap next to the
    matmuls) rather than held as a buffer: nothing to materialise from the meta device, nothing for
    bf16-true to round, nothing in checkpoints."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (``[batch, heads, time, head_dim]``) by the angles of its positions (the
    "rotate half" pairing); a rotation, so every vector keeps its norm, and q_m . k_n depends on m - n only."""
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    return rotated.to(x.dtype)


class Attention(nn.Module):
    """Causal grouped-query attention: ``heads`` query heads share ``kv_heads`` key/value heads
    (kv_heads = heads: multi-head; 1: multi-query), rotary positions on q and k."""

    def __init__(self, width: int, heads: int, kv_heads: int, rope_theta: float, out_std: float):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.rope_theta = heads, kv_heads, width // heads, rope_theta
        self.wq = nn.Linear(width, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(width, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, width, bias=False)
        self.wo.init_std = out_std  # a residual branch's output: scaled by depth (init_llama_weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, _ = x.shape
        # -1 heads: under tensor parallel each rank holds heads / tp query and kv_heads / tp k/v heads
        # (the same grouping: tp divides both), so rope and the GQA grouping work on the shard as on the whole.
        q = self.wq(x).view(batch, time, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, time, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, time, -1, self.head_dim).transpose(1, 2)
        cos, sin = rope_angles(time, self.head_dim, self.rope_theta, x.device)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # enable_gqa: each group of heads // kv_heads query heads reads one k/v head, without a copy.
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        return self.wo(out.transpose(1, 2).reshape(batch, time, -1))


def ffn_hidden_size(width: int, multiple_of: int, multiplier: float | None) -> int:
    """Llama's SwiGLU width: 2/3 of 4 x width (three matrices cost what two of 4 x width would),
    times ``multiplier``, rounded up to a multiple of ``multiple_of`` (for efficient matmul shapes)."""
    hidden = int(2 * 4 * width / 3)
    if multiplier is not None:
        hidden = int(multiplier * hidden)
    return multiple_of * math.ceil(hidden / multiple_of)


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, width: int, hidden: int, out_std: float):
        super().__init__()
        self.w1 = nn.Linear(width, hidden, bias=False)
        self.w3 = nn.Linear(width, hidden, bias=False)
        self.w2 = nn.Linear(hidden, width, bias=False)
        self.w2.init_std = out_std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    """Pre-norm block: x + attention(rmsnorm(x)), then + swiglu(rmsnorm(x)). The unit FSDP shards,
    activation checkpointing recomputes and compile compiles."""

    def __init__(self, width: int, heads: int, kv_heads: int, ffn_hidden: int, rope_theta: float, norm_eps: float,
                 out_std: float):
        super().__init__()
        self.attention_norm = nn.RMSNorm(width, eps=norm_eps)
        self.attention = Attention(width, heads, kv_heads, rope_theta, out_std)
        self.ffn_norm = nn.RMSNorm(width, eps=norm_eps)
        self.feed_forward = FeedForward(width, ffn_hidden, out_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


def init_llama_weights(module: nn.Module) -> None:
    """Normal(0, 0.02) weights; the projections back into the residual stream (attention ``wo``,
    SwiGLU ``w2``) 0.02 / sqrt(2 x layers), so the stream's variance does not grow with depth."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=getattr(module, "init_std", 0.02))
    if isinstance(module, nn.RMSNorm):
        module.reset_parameters()


class Llama(nn.Module):
    """Token embedding, ``layers`` LlamaBlocks, a final RMSNorm and an untied output projection."""

    def __init__(self, vocab_size: int, layers: int, width: int, heads: int, kv_heads: int, ffn_hidden: int,
                 rope_theta: float, norm_eps: float):
        super().__init__()
        out_std = 0.02 / math.sqrt(2 * layers)
        self.tok_embeddings = nn.Embedding(vocab_size, width)
        self.layers = nn.ModuleList(
            LlamaBlock(width, heads, kv_heads, ffn_hidden, rope_theta, norm_eps, out_std) for _ in range(layers))
        self.norm = nn.RMSNorm(width, eps=norm_eps)
        self.output = nn.Linear(width, vocab_size, bias=False)
        self.apply(init_llama_weights)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


class LlamaModule(TextRecipe, TrainModule):
    """Next-token prediction with a Llama-style model on the text recipes' data (``recipes/text_data.py``).

    Args:
        data_path / tokens / source / stream / tokenizer / hf / max_bytes / block_size / val_fraction: the
            data, as in ``trainer.recipes.gpt.GPTModule`` (``recipes/text_module.py``).
        vocab_size: the embedding and output size; null = the data's vocabulary (bytes: 256; token
            shards: the manifest's); a larger value pads it (e.g. to a multiple of 64 for GPU kernels).
        layers / width / heads: depth, model width and query heads (width divisible by heads).
        kv_heads: key/value heads (grouped-query attention); divides heads; null = heads.
        ffn_multiple_of / ffn_dim_multiplier: the SwiGLU width (see ``ffn_hidden_size``).
        rope_theta: the rotary base (10000 in Llama 2, 500000 in Llama 3).
        norm_eps: RMSNorm's epsilon.
    """

    def __init__(
        self,
        optimizer=None,
        scheduler=None,
        data_path: str | None = None,
        max_bytes: int = 1_000_000,
        block_size: int = 64,
        val_fraction: float = 0.05,
        tokens: str | None = None,
        source: str | None = None,
        stream: bool = False,
        tokenizer: str | None = None,
        hf: dict | None = None,
        vocab_size: int | None = None,
        layers: int = 2,
        width: int = 128,
        heads: int = 4,
        kv_heads: int | None = 2,
        ffn_multiple_of: int = 32,
        ffn_dim_multiplier: float | None = None,
        rope_theta: float = 10000.0,
        norm_eps: float = 1e-5,
    ):
        super().__init__(optimizer, scheduler)
        kv_heads = heads if kv_heads is None else kv_heads
        if heads < 1 or width % heads:
            raise ValueError(f"module.width={width} must be divisible by module.heads={heads}")
        if (width // heads) % 2:
            raise ValueError(f"module.width / module.heads = {width // heads} (the head size) must be even for rotary embeddings")
        if kv_heads < 1 or heads % kv_heads:
            raise ValueError(f"module.kv_heads={kv_heads} must divide module.heads={heads} (1 = multi-query, heads = multi-head)")
        for name, value in (("layers", layers), ("ffn_multiple_of", ffn_multiple_of), ("block_size", block_size)):
            if value < 1:
                raise ValueError(f"module.{name}={value} must be >= 1")
        if rope_theta <= 0:
            raise ValueError(f"module.rope_theta={rope_theta} must be > 0 (Llama 2: 10000, Llama 3: 500000)")
        if ffn_dim_multiplier is not None and ffn_dim_multiplier <= 0:
            raise ValueError(f"module.ffn_dim_multiplier={ffn_dim_multiplier} must be > 0 or null")
        self.init_text_data(block_size, max_bytes, val_fraction, data_path, tokens, source, stream, tokenizer, hf)
        if vocab_size is not None and vocab_size < 1:
            raise ValueError(f"module.vocab_size={vocab_size} must be >= 1, or null for the data's vocabulary")
        self.padded_vocab_size = vocab_size  # checked against the data's vocabulary when the model is built
        self.model_args = dict(
            layers=layers, width=width, heads=heads, kv_heads=kv_heads,
            ffn_hidden=ffn_hidden_size(width, ffn_multiple_of, ffn_dim_multiplier), rope_theta=rope_theta,
            norm_eps=norm_eps)
        self.model: Llama | None = None

    def configure_model(self) -> None:
        # Built on each rank (after seeding), so the launcher process never holds the weights.
        if self.model is None:
            vocab = self.vocab_size  # the data's (read on first use)
            if self.padded_vocab_size is not None and self.padded_vocab_size < vocab:
                raise ValueError(f"module.vocab_size={self.padded_vocab_size} is below the data's vocabulary of "
                                 f"{vocab} tokens; leave it null (the data's) or give at least {vocab}")
            self.model = Llama(vocab_size=self.padded_vocab_size or vocab, **self.model_args)

    def block_classes(self) -> tuple[type[nn.Module], ...]:
        return (LlamaBlock,)

    def pipeline_layers(self) -> list[nn.Module]:
        # strategy=pipeline: embedding, each block, then final norm + output, cut into stages.
        return [self.model.tok_embeddings, *self.model.layers, nn.Sequential(self.model.norm, self.model.output)]

    def tensor_parallel_plan(self) -> dict:
        """torchtitan's Llama plan: q / k / v and SwiGLU's w1 / w3 split by columns (heads, hidden
        width), wo and w2 by rows, the norms sequence-parallel between them (``recipes/tp_plans.py``),
        the output's logits sharded over the vocabulary (loss parallel) unless the strategy turns it off."""
        from torch.distributed.tensor.parallel import ColwiseParallel, SequenceParallel

        layer = "model.layers.*."
        return {
            "model.tok_embeddings": tp_plans.token_embedding(),
            layer + "attention_norm": SequenceParallel(),
            layer + "attention": tp_plans.gather_sequence(),
            layer + "attention.wq": ColwiseParallel(),
            layer + "attention.wk": ColwiseParallel(),
            layer + "attention.wv": ColwiseParallel(),
            layer + "attention.wo": tp_plans.block_output(),
            layer + "ffn_norm": SequenceParallel(),
            layer + "feed_forward": tp_plans.gather_sequence(),
            layer + "feed_forward.w1": ColwiseParallel(),
            layer + "feed_forward.w3": ColwiseParallel(),
            layer + "feed_forward.w2": tp_plans.block_output(),
            "model.norm": SequenceParallel(),
            "model.output": tp_plans.vocabulary_head(tp_plans.loss_parallel_enabled(self)),
        }

    def check_tensor_parallel(self, tp: int) -> None:
        tp_plans.check_degree(tp, heads=self.model_args["heads"], kv_heads=self.model_args["kv_heads"],
                              block_size=self.block_size)

    def init_weights(self, module: nn.Module) -> None:
        # Owning initialisation makes strategy.meta_init=true give the same weights as an eager build.
        init_llama_weights(module)

    # The gpt recipe's steps and metrics (loss; bits per byte in validation), shared, not copied:
    # they only need self.model (tokens -> logits) and TextRecipe's data side.
    _loss = gpt.GPTModule._loss
    training_step = gpt.GPTModule.training_step
    validation_step = gpt.GPTModule.validation_step
    pipeline_loss = gpt.GPTModule.pipeline_loss
