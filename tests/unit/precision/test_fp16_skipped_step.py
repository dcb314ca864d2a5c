"""An fp16 step skipped for a gradient overflow logs what it is and fires no optimizer-step hook."""

import functools
import math

import pytest
import torch

from tests.support.helpers import OverflowAt, fit
from trainer.precision import Precision

pytestmark = pytest.mark.timeout(300)


class HookedOverflow(OverflowAt):
    """OverflowAt recording the steps on which ``on_before_optimizer_step`` ran."""

    def __init__(self, fused: bool, **kwargs):
        super().__init__(**kwargs)
        self.optimizer_factory = functools.partial(torch.optim.AdamW, lr=0.01, weight_decay=0.01, fused=fused)
        self.hooked: list[int] = []
        self.metrics: dict[int, dict] = {}  # the logged metrics as the step reports them (metrics.jsonl writes inf as null)

    def on_before_optimizer_step(self, optimizer):
        self.hooked.append(self.done + 1)

    def on_train_step_end(self, step, metrics):
        super().on_train_step_end(step, metrics)
        if metrics is not None:
            self.metrics[step] = dict(metrics)


def precision():
    return Precision("fp16-mixed", initial_scale_power=10, hysteresis=1)


@pytest.mark.parametrize("fused", [True, False], ids=["sync-free", "host-read"])
def test_an_overflowing_logging_step_logs_inf_counts_the_skip_and_fires_no_hook(tmp_path, fused):
    # Step 3's loss is infinite; every step logs; clipping is on (it would turn the inf gradients' norm to nan).
    args = dict(batch_size=16, precision=precision(), gradient_clip_val=1.0, log_every_n_steps=1)
    module = HookedOverflow(fused, bad_step=3)
    fit(tmp_path / "three", module, max_steps=4, **args)
    rows = module.metrics
    assert math.isinf(rows[3]["train/grad_norm"])
    assert all(math.isfinite(rows[s]["train/grad_norm"]) for s in (1, 2, 4))
    assert [rows[s]["train/skipped_steps"] for s in range(1, 5)] == [0, 0, 1, 1]
    assert module.hooked == [1, 2, 4]
    # The skipped step changed nothing: a 3-step run skipping step 3 ends with a 2-step run's parameters.
    fit(tmp_path / "two", HookedOverflow(fused, bad_step=99), max_steps=2, **args)
    fit(tmp_path / "skip", HookedOverflow(fused, bad_step=3), max_steps=3, **args)
    two = torch.load(tmp_path / "two" / "params_rank0.pt")
    skip = torch.load(tmp_path / "skip" / "params_rank0.pt")
    for name in two:
        assert torch.equal(two[name], skip[name]), name


def test_an_overflowing_quiet_sync_free_step_still_fires_the_hook_and_skips_the_update(tmp_path):
    # A quiet step cannot know of its overflow without a host sync: the hook runs (documented), the
    # fused kernel skips the update, and the next logging step counts the skip.
    args = dict(batch_size=16, precision=precision(), gradient_clip_val=1.0, log_every_n_steps=2)
    module = HookedOverflow(True, bad_step=3)
    fit(tmp_path / "skip", module, max_steps=4, **args)
    assert module.hooked == [1, 2, 3, 4]
    rows = module.metrics
    assert sorted(rows) == [2, 4] and rows[4]["train/skipped_steps"] == 1 and math.isfinite(rows[4]["train/grad_norm"])
