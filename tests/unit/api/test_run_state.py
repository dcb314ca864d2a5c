"""Run state with Lightning's names (module and trainer), live during the run on every rank and right
on the caller's trainer after fit; trainer.should_stop stops every rank at the same step."""

import json
import os
import pickle

import pytest
import torch

from tests.support.helpers import Regressor
from trainer import Trainer
from trainer.strategies.ddp import DDPStrategy

pytestmark = pytest.mark.timeout(300)

# 64 samples, global batch 16: 4 optimizer steps per epoch, 6 steps = epoch 0 and half of epoch 1.
SAMPLES, STEPS, STEPS_PER_EPOCH = 64, 6, 4
LAYOUTS = {
    "single": dict(batch_size=8, accumulate_grad_batches=2),
    "ddp": dict(strategy=DDPStrategy(), devices=2, batch_size=8),
}


class RunStateRecorder(Regressor):
    """Records the run state seen from training_step and configure_optimizers, one file per rank."""

    def __init__(self, stop_at=None, stop_rank=0):
        super().__init__(num_samples=SAMPLES)
        self.seen, self.stop_at, self.stop_rank = [], stop_at, stop_rank

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.01)
        self.seen.append({"estimated_stepping_batches": self.trainer.estimated_stepping_batches})
        return optimizer, torch.optim.lr_scheduler.OneCycleLR(
            optimizer, max_lr=0.05, total_steps=self.trainer.estimated_stepping_batches)

    def training_step(self, batch, batch_idx):
        trainer = self.trainer
        self.seen.append({
            "global_step": self.global_step, "trainer_global_step": trainer.global_step,
            "current_epoch": self.current_epoch, "trainer_current_epoch": trainer.current_epoch,
            "global_rank": self.global_rank, "local_rank": self.local_rank, "world_size": self.world_size,
            "device": str(self.device), "is_global_zero": trainer.is_global_zero, "log_dir": trainer.log_dir,
            "optimizers": [type(o).__name__ for o in trainer.optimizers],
            "lr_schedulers": [type(s).__name__ for s in trainer.lr_schedulers],
            "should_stop": trainer.should_stop,
        })
        return super().training_step(batch, batch_idx)

    def on_train_step_end(self, step, metrics):
        if metrics is not None:
            self.seen.append({"step": step, "callback_metrics": sorted(self.trainer.callback_metrics)})
        if step == self.stop_at and self.global_rank == self.stop_rank:
            self.trainer.should_stop = True  # one rank only: the trainer agrees on it

    def on_fit_end(self):
        with open(os.path.join(self.trainer.run_dir, f"seen_rank{self.global_rank}.json"), "w") as f:
            json.dump({"seen": self.seen, "final_step": self.trainer.global_step}, f)


def _read(run_dir, rank):
    with open(os.path.join(str(run_dir), f"seen_rank{rank}.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_run_state_inside_training_step_and_after_fit(tmp_path, layout):
    args = LAYOUTS[layout]
    world = args.get("devices", 1)
    trainer = Trainer(max_steps=STEPS, log_every_n_steps=2, loggers=["jsonl"], progress_bar=False,
                      collective_timeout_s=120, run_dir=str(tmp_path), **args)
    module = RunStateRecorder()
    trainer.fit(module)
    for rank in range(world):
        seen = _read(tmp_path, rank)["seen"]
        assert seen[0] == {"estimated_stepping_batches": STEPS}
        steps = [s for s in seen[1:] if "global_step" in s]
        assert len(steps) == STEPS * 2 // world  # micro-batches run on this rank
        for index, state in enumerate(steps):
            done = index // (2 // world)  # optimizer steps done before this micro-batch
            assert state == {
                "global_step": done, "trainer_global_step": done,
                "current_epoch": done // STEPS_PER_EPOCH, "trainer_current_epoch": done // STEPS_PER_EPOCH,
                "global_rank": rank, "local_rank": rank, "world_size": world, "device": "cpu",
                "is_global_zero": rank == 0, "log_dir": str(tmp_path), "optimizers": ["SGD"],
                "lr_schedulers": ["OneCycleLR"], "should_stop": False,
            }, (rank, index)
        logged = [s for s in seen if "callback_metrics" in s]
        assert [s["step"] for s in logged] == [2, 4, 6] and all("train/loss" in s["callback_metrics"] for s in logged)
    # The caller's trainer (a spawned run trained a pickled copy of it).
    assert (trainer.global_step, trainer.current_epoch) == (STEPS, 1)
    assert module.trainer is trainer and (module.global_step, module.current_epoch) == (STEPS, 1)
    assert "train/loss" in trainer.logged_metrics and trainer.callback_metrics == {k: v for k, v in trainer.logged_metrics.items() if k != "epoch"}
    assert trainer.is_global_zero and trainer.log_dir == str(tmp_path)
    pickle.dumps(trainer)  # a finished in-process run is not part of the trainer's pickled state


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_should_stop_set_on_one_rank_stops_every_rank_at_the_next_logging_step(tmp_path, layout):
    args = LAYOUTS[layout]
    world = args.get("devices", 1)
    trainer = Trainer(max_steps=12, max_epochs=None, log_every_n_steps=2, loggers=["jsonl"], progress_bar=False,
                      collective_timeout_s=120, run_dir=str(tmp_path), **args)
    trainer.fit(RunStateRecorder(stop_at=3, stop_rank=world - 1))
    for rank in range(world):
        assert _read(tmp_path, rank)["final_step"] == 4  # set after step 3, agreed at logging step 4
    assert trainer.global_step == 4


def test_should_stop_outside_a_run_or_not_a_bool_is_refused():
    trainer = Trainer(loggers=[])
    assert trainer.should_stop is False
    with pytest.raises(RuntimeError, match="only while fit runs"):
        trainer.should_stop = True
    with pytest.raises(TypeError, match="True or False, got 1"):
        trainer.should_stop = 1
    with pytest.raises(RuntimeError, match="estimated_stepping_batches is known once fit"):
        trainer.estimated_stepping_batches
    assert trainer.optimizers == [] and trainer.lr_schedulers == []


def test_module_without_a_trainer_has_neutral_run_state():
    module = Regressor()
    assert (module.global_step, module.current_epoch, module.global_rank, module.local_rank, module.world_size) == (0, 0, 0, 0, 1)
    assert module.device == torch.device("cpu")
