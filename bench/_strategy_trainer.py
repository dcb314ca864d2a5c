"""bench/strategy_baselines.py's trainer contender, in its own file: the trainer's spawned workers
unpickle the module class by name, and only the trainer's runs import the trainer."""

from __future__ import annotations

import tempfile

from _strategy_model import ACCUMULATE, GLOBAL_BATCH, LOG_EVERY, MICROBATCHES, Block, adamw, blocks, dataset, loss_fn
from trainer import TrainModule, Trainer


class BlocksModule(TrainModule):
    """The hand-written loops' blocks, data, loss and optimizer, with the hooks each strategy reads:
    FSDP's units (``block_classes``), the pipeline's layers and loss, the tensor-parallel plan."""

    def __init__(self, width: int, depth: int, steps: int):
        super().__init__(optimizer=adamw)
        self.width, self.steps = width, steps
        self.blocks = blocks(width, depth)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x

    def train_dataset(self):
        return dataset(self.width, self.steps * ACCUMULATE)

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        return loss_fn(self(inputs), targets)

    def block_classes(self):
        return (Block,)

    def pipeline_layers(self):
        return list(self.blocks)

    def pipeline_loss(self, output, batch):
        return loss_fn(output, batch[1])

    def tensor_parallel_plan(self):
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        return {"blocks.*.up": ColwiseParallel(), "blocks.*.down": RowwiseParallel()}


def strategy_settings(strategy: str, world: int) -> dict:
    """The Trainer arguments that make ``strategy`` on ``world`` ranks train the hand-written loop's
    global batch: the strategy object, ``batch_size`` (per rank per micro-batch) and the accumulation."""
    from trainer.strategies.ddp import DDPStrategy
    from trainer.strategies.fsdp import FSDPStrategy
    from trainer.strategies.nd import NDStrategy
    from trainer.strategies.pipeline import PipelineStrategy

    data_parallel = {"batch_size": GLOBAL_BATCH // (world * ACCUMULATE), "accumulate_grad_batches": ACCUMULATE}
    if strategy == "ddp":
        return {"strategy": DDPStrategy(), **data_parallel}
    if strategy == "zero1":
        return {"strategy": DDPStrategy(zero1=True), **data_parallel}
    if strategy in ("fsdp_full", "fsdp_grad_op"):
        return {"strategy": FSDPStrategy(sharding=strategy[len("fsdp_"):]), **data_parallel}
    if strategy.startswith("pipeline_"):
        schedule = {"pipeline_gpipe": "gpipe", "pipeline_1f1b": "1f1b", "pipeline_interleaved": "interleaved_1f1b"}
        return {"strategy": PipelineStrategy(schedule=schedule[strategy], microbatches=MICROBATCHES, partition="uniform"),
                "batch_size": GLOBAL_BATCH}
    if strategy == "tp":
        return {"strategy": NDStrategy(tp=world), "batch_size": GLOBAL_BATCH}
    raise ValueError(f"unknown strategy {strategy!r}")


def run_trainer(strategy: str, world: int, steps: int, width: int, depth: int) -> None:
    with tempfile.TemporaryDirectory() as run_dir:
        Trainer(devices=world, max_steps=steps, log_every_n_steps=LOG_EVERY, loggers=[], checkpoint=None,
                progress_bar=False, enable_model_summary=False, run_dir=run_dir,
                **strategy_settings(strategy, world)).fit(BlocksModule(width, depth, steps))
