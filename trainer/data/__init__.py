"""Which samples each rank loads: the global-batch plan (``batch_plan.py``), the epoch's order per
position (``permutation.py``), loaders that load a plan's batches under position-keyed seeds
(``loaders.py``; a batch of in-memory tensors read in one gather: ``batched_read.py``), one rank's
validation batches (``validation_shard.py``), the module's data hooks and DataLoaders read once per
run (``user_loader.py``), and iterable datasets (``streaming/``)."""

from trainer.data.batch_plan import GlobalBatchPlan, MicroBatch, RankBatches, SamplerStream, StepPlan, validation_shard
from trainer.data.loaders import LoaderOptions, build_loader
from trainer.runtime.seeding import derive_seed, seed_everything, seeded

__all__ = ["GlobalBatchPlan", "LoaderOptions", "MicroBatch", "RankBatches", "SamplerStream", "StepPlan",
           "build_loader", "derive_seed", "seed_everything", "seeded", "validation_shard"]
