"""A module of one's own with its own tensor-parallel plan, for strategy=nd's tests: tokens through
residual MLP blocks to per-token classes, the up projections column-split, the down ones row-split,
the norms sequence-parallel, the classifier's logits left sharded for loss parallel."""

from __future__ import annotations

import os
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from trainer import TrainModule

SEQ, FEATURES, CLASSES = 4, 6, 8


def token_data(num_samples: int, seed: int = 7, masked: bool = False) -> TensorDataset:
    """Per-token classes; ``masked``: about a third of the targets are -100 (ignored: padding)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_samples, SEQ, FEATURES, generator=generator)
    w = torch.randn(FEATURES, CLASSES, generator=generator)
    y = (x @ w + 0.5 * torch.randn(num_samples, SEQ, CLASSES, generator=generator)).argmax(-1)
    if masked:
        y[torch.rand(num_samples, SEQ, generator=generator) < 0.35] = -100
    return TensorDataset(x, y)


class MLPBlock(nn.Module):
    def __init__(self, width: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(self.norm(x))))


class TokenClassifier(TrainModule):
    """``plan``: "sequence" (every layer split: the input projection row-split into a sequence-sharded
    stream, norms sequence-parallel, logits vocabulary-sharded, loss parallel), "mlp" (only the
    blocks' up / down: the rest replicated, plain tensors), "none" (no plan), "missing" (a plan
    naming a submodule the model lacks). Saves the full final parameters to ``<run_dir>/params.pt``."""

    def __init__(self, plan: str = "sequence", width: int = 16, hidden: int = 32, depth: int = 2, lr: float = 0.01,
                 num_samples: int = 96, val_samples: int = 0, test_samples: int = 0, predict_samples: int = 0,
                 count_tokens: bool = False):
        super().__init__(optimizer=partial(torch.optim.AdamW, lr=lr, weight_decay=0.01))
        self.plan, self.width, self.hidden, self.depth = plan, width, hidden, depth
        self.num_samples, self.val_samples = num_samples, val_samples
        self.test_samples, self.predict_samples = test_samples, predict_samples
        self.count_tokens = count_tokens

    def configure_model(self):
        self.inp = nn.Linear(FEATURES, self.width)
        self.blocks = nn.ModuleList(MLPBlock(self.width, self.hidden) for _ in range(self.depth))
        self.norm = nn.LayerNorm(self.width)
        self.out = nn.Linear(self.width, CLASSES)

    def block_classes(self):
        return (MLPBlock,)

    def tensor_parallel_plan(self):
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

        if self.plan == "none":
            return None
        if self.plan == "mlp":
            return {"blocks.*.up": ColwiseParallel(), "blocks.*.down": RowwiseParallel()}
        if self.plan == "missing":
            return {"blocks.*.up": ColwiseParallel(), "blocks.*.dwn": RowwiseParallel()}
        return {
            "inp": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "blocks.*.norm": SequenceParallel(),
            "blocks.*.up": ColwiseParallel(input_layouts=Shard(1)),
            "blocks.*.down": RowwiseParallel(output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "out": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
        }

    def check_tensor_parallel(self, tp: int) -> None:
        sizes = {"hidden": self.hidden, "classes": CLASSES, "features": FEATURES, "sequence": SEQ}
        bad = [f"{name} {size}" for name, size in sizes.items() if size % tp]
        if bad:
            raise ValueError(f"strategy.tp={tp} does not divide the model's {', '.join(bad)}; choose a tp dividing them")

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(self.norm(h))

    def _loss(self, batch):
        x, y = batch
        logits = self(x)
        return logits, F.cross_entropy(logits.flatten(0, 1), y.flatten())

    def train_dataset(self):
        return token_data(self.num_samples, masked=self.count_tokens)

    def val_dataset(self):
        return token_data(self.val_samples, seed=8) if self.val_samples else None

    def test_dataset(self):
        return token_data(self.test_samples, seed=9) if self.test_samples else None

    def predict_dataset(self):
        return token_data(self.predict_samples, seed=10) if self.predict_samples else None

    def training_step(self, batch, batch_idx):
        logits, loss = self._loss(batch)
        if self.count_tokens:  # (trainer.loss_normalization=tokens: the loss is a mean over the counted tokens)
            return {"loss": loss, "num_tokens": (batch[1] != -100).sum()}
        return {"loss": loss, "logit_mean": logits.mean()}

    def validation_step(self, batch, batch_idx):
        return self._loss(batch)[1]

    def test_step(self, batch, batch_idx):
        logits, loss = self._loss(batch)
        return {"loss": loss, "logit_mean": logits.mean()}

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def on_train_start(self):
        # Each rank's local parameter shapes: the tests check the model was split as planned.
        import json

        from trainer.runtime.tensors import local_tensor

        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        shapes = {name: list(local_tensor(p).shape) for name, p in self.named_parameters()}
        with open(os.path.join(self.trainer.run_dir, f"shapes_rank{rank}.json"), "w") as f:
            json.dump(shapes, f)

    def on_fit_end(self):
        state = self.trainer.strategy.full_state_dict(self)  # every rank: a collective under nd
        if state:
            torch.save(state, os.path.join(self.trainer.run_dir, "params.pt"))


class LightningWayClassifier(TokenClassifier):
    """Lightning's way: ``configure_model`` splits the model itself over ``self.device_mesh["tp"]``
    (``shard=True``: and shards it with ``fully_shard`` over ``self.device_mesh["dp_shard"]``); it
    declares no plan. One process (no mesh): the plain model."""

    def __init__(self, shard: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.shard = shard

    def tensor_parallel_plan(self):
        return None

    def configure_model(self):
        super().configure_model()
        mesh = self.device_mesh
        if mesh is None:
            return
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import parallelize_module

        parallelize_module(self, mesh["tp"], TokenClassifier.tensor_parallel_plan(self))
        if self.shard:
            for block in self.blocks:
                fully_shard(block, mesh=mesh["dp_shard"])
            fully_shard(self, mesh=mesh["dp_shard"])


class DropoutClassifier(TokenClassifier):
    """The "mlp" plan (the blocks' outputs are replicated plain tensors on every tensor-parallel rank)
    with dropout on those replicated activations. Each rank writes its training losses and its
    replicated (plain-tensor) parameters to ``<run_dir>/rank<r>.pt`` at the end of fit."""

    def __init__(self, p: float = 0.3, **kwargs):
        super().__init__(plan="mlp", **kwargs)
        self.p = p
        self.losses: list[float] = []

    def configure_model(self):
        super().configure_model()
        self.dropout = nn.Dropout(self.p)

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = self.dropout(block(h))  # a replicated activation: every tp rank must draw the same mask
        return self.out(self.norm(h))

    def training_step(self, batch, batch_idx):
        loss = self._loss(batch)[1]
        self.losses.append(float(loss.detach()))
        return loss

    def on_fit_end(self):
        from torch.distributed.tensor import DTensor

        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        plain = {name: p.detach().clone() for name, p in self.named_parameters() if not isinstance(p, DTensor)}
        torch.save({"losses": self.losses, "replicated": plain}, os.path.join(self.trainer.run_dir, f"rank{rank}.pt"))


class LoggingClassifier(TokenClassifier):
    """Logs, with ``self.log``, metrics of the logits: under strategy=nd's "sequence" plan with loss
    parallel they are DTensors sharded on the vocabulary (``logits.mean()`` a partial one)."""

    def training_step(self, batch, batch_idx):
        logits, loss = self._loss(batch)
        self.log("logged_logit_mean", logits.mean())
        self.log("logged_logit_max", logits.max(), reduce_fx="max", on_epoch=True)
        return loss


class ManualClassifier(TokenClassifier):
    """Manual optimization: two halves of the batch accumulated by hand (the first inside
    ``no_backward_sync()``), clipping by the global norm, the optimizer's step."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        x, y = batch
        half = len(x) // 2
        with self.no_backward_sync():
            first = self._loss((x[:half], y[:half]))[1]
            self.manual_backward(first / 2)
        second = self._loss((x[half:], y[half:]))[1]
        self.manual_backward(second / 2)
        self.clip_gradients(optimizer, gradient_clip_val=0.5)
        optimizer.step()
        optimizer.zero_grad()
        return (first.detach() + second.detach()) / 2
