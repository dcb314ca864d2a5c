"""bench/strategy_baselines.py: the trainer contender of every strategy is a Trainer the trainer accepts,
with the hand-written loop's global batch, and the module's hooks name its own submodules. (The
whole-process runs take minutes on a loaded machine: ``python bench/strategy_baselines.py --quick``
checks them; no timing here.)"""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from _strategy_loops import PIPELINE, STRATEGIES  # noqa: E402
from _strategy_model import ACCUMULATE, GLOBAL_BATCH, MICROBATCHES  # noqa: E402
from _strategy_trainer import BlocksModule, strategy_settings  # noqa: E402

from trainer import Trainer  # noqa: E402
from trainer.strategies.tensor_parallel import expand_plan, module_plan  # noqa: E402


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_strategy_builds_a_trainer_with_the_same_global_batch(strategy, tmp_path):
    settings = strategy_settings(strategy, 2)
    trainer = Trainer(devices=2, max_steps=3, loggers=[], checkpoint=None, progress_bar=False, run_dir=str(tmp_path),
                      **settings)
    if strategy in PIPELINE or strategy == "tp":  # every rank reads the whole global batch
        assert trainer.batch_size == GLOBAL_BATCH and trainer.accumulate_grad_batches == 1
    else:
        assert trainer.batch_size * trainer.accumulate_grad_batches * 2 == GLOBAL_BATCH
        assert trainer.accumulate_grad_batches == ACCUMULATE
    if strategy in PIPELINE:
        assert settings["strategy"].microbatches == MICROBATCHES


def test_the_modules_plan_and_layers_name_its_own_blocks():
    module = BlocksModule(width=8, depth=4, steps=2)
    plan = expand_plan(module, module_plan(module))
    assert sorted(plan) == sorted(f"blocks.{i}.{part}" for i in range(4) for part in ("up", "down"))
    assert module.pipeline_layers() == list(module.blocks)
    with pytest.raises(ValueError, match="unknown strategy"):
        strategy_settings("zero3", 2)
