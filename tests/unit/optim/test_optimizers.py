"""What configure_optimizers may return, and when the schedulers step (trainer/optim/optimizers.py,
trainer/optim/lr_scheduling.py): Lightning's single-optimizer shapes are accepted, everything else is an
error naming it; interval / frequency / ReduceLROnPlateau are honoured, and a resumed run steps its
schedulers exactly as an uninterrupted one.

All single-process runs of a tiny MLP (tests/support/helpers.py's Regressor): a few steps each.
"""

import json
import logging
import os
import re

import pytest
import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, ReduceLROnPlateau, StepLR

from tests.support.helpers import HostSyncCounter, OverflowAt, Regressor, new_trainer, read_metrics, run_trainer
from trainer.callbacks import LearningRateMonitor
from trainer.api.errors import MisconfigurationException
from trainer.checkpoint import layout
from trainer.optim.lr_scheduling import LRScheduling
from trainer.optim.optimizers import split_optimizers
from trainer.precision import Precision

pytestmark = pytest.mark.timeout(120)
LR = 0.05


class Scheduled(Regressor):
    """A Regressor whose configure_optimizers returns ``make(SGD(...))``; records the learning
    rate each optimizer step uses."""

    def __init__(self, make, **kwargs):
        super().__init__(lr=LR, **kwargs)
        self.make = make
        self.lrs: list[float] = []

    def configure_optimizers(self):
        return self.make(torch.optim.SGD(self.parameters(), lr=LR))

    def on_before_optimizer_step(self, optimizer):
        self.lrs.append(optimizer.param_groups[0]["lr"])

    def on_fit_end(self):
        super().on_fit_end()
        rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
        with open(os.path.join(self.trainer.run_dir, f"lrs_rank{rank}.json"), "w") as f:
            json.dump(self.lrs, f)


def rows(run_dir, key):
    """{step: value} of metric ``key`` in the run's metrics.jsonl."""
    return {r["step"]: r[key] for r in read_metrics(str(run_dir)) if key in r}


def plateau_lrs(events, steps, frequency, **options):
    """The learning rate of each step 1..steps for a ReduceLROnPlateau fed ``events`` ({step: value}
    of its monitor) after those steps, every ``frequency``-th event."""
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=LR)
    scheduler = ReduceLROnPlateau(optimizer, **options)
    lrs, seen = [], 0
    for step in range(1, steps + 1):
        lrs.append(optimizer.param_groups[0]["lr"])
        if step in events:
            seen += 1
            if seen % frequency == 0:
                scheduler.step(events[step])
    return lrs


# ----- shapes ----------------------------------------------------------------------------------------------
ACCEPTED_SHAPES = {
    "optimizer, scheduler": lambda o, s: (o, s),
    "[optimizer, scheduler]": lambda o, s: [o, s],
    "([optimizer], [scheduler])": lambda o, s: ([o], [s]),
    "{optimizer, lr_scheduler}": lambda o, s: {"optimizer": o, "lr_scheduler": s},
    "{optimizer, lr_scheduler: dict}": lambda o, s: {"optimizer": o, "lr_scheduler": {"scheduler": s, "interval": "step"}},
    "[{optimizer, lr_scheduler}]": lambda o, s: [{"optimizer": o, "lr_scheduler": s}],
}


@pytest.mark.parametrize("shape", list(ACCEPTED_SHAPES))
def test_lightning_shapes_step_the_scheduler_every_optimizer_step(tmp_path, shape):
    module = Scheduled(lambda o: ACCEPTED_SHAPES[shape](o, StepLR(o, step_size=1, gamma=0.5)))
    run_trainer(tmp_path, module, max_steps=4)
    assert module.lrs == [LR, LR / 2, LR / 4, LR / 8]


ALONE = {"optimizer": lambda o: o, "[optimizer]": lambda o: [o], "(optimizer,)": lambda o: (o,),
         "([optimizer], [])": lambda o: ([o], []), "{optimizer}": lambda o: {"optimizer": o},
         "(optimizer, None)": lambda o: (o, None), "{optimizer, lr_scheduler: None}": lambda o: {"optimizer": o, "lr_scheduler": None}}


@pytest.mark.parametrize("shape", list(ALONE))
def test_optimizer_alone_keeps_its_learning_rate(tmp_path, shape):
    make = ALONE[shape]
    module = Scheduled(make)
    run_trainer(tmp_path, module, max_steps=3)
    assert module.lrs == [LR] * 3


class GAN(Regressor):
    """Two models, two optimizers (as a GAN returns them)."""

    def __init__(self, shape):
        super().__init__()
        self.shape = shape
        self.critic = nn.Linear(1, 1)

    def configure_optimizers(self):
        opt_g = torch.optim.SGD(self.net.parameters(), lr=0.1)
        opt_d = torch.optim.SGD(self.critic.parameters(), lr=0.1)
        return {"list": [opt_g, opt_d], "lists": ([opt_g, opt_d], []),
                "dicts": [{"optimizer": opt_g}, {"optimizer": opt_d}]}[self.shape]


@pytest.mark.parametrize("shape", ["list", "lists", "dicts"])
def test_two_optimizers_are_refused_under_automatic_optimization(tmp_path, shape):
    # Before: [opt_g, opt_d] was read as (optimizer, scheduler), opt_d.step() ran as "the scheduler"
    # and D's gradients were never zeroed, without a word.
    with pytest.raises(TypeError, match=r"2 optimizers \(\[a SGD, a SGD\]\) with automatic optimization \(training "
                                        r"with multiple optimizers is only supported with manual optimization; "
                                        r"automatic steps one, as Lightning >= 2\.0\): set self\.automatic_optimization "
                                        r"= False") as raised:
        run_trainer(tmp_path, GAN(shape), max_steps=2)
    assert isinstance(raised.value, RuntimeError)  # (Lightning's type too)


def test_a_training_step_taking_optimizer_idx_is_refused_under_automatic_optimization(tmp_path):
    # Lightning 1.x's shape: the step would never be given optimizer_idx; said when fit starts, not at the first step.
    class OldStyle(Regressor):
        def training_step(self, batch, batch_idx, optimizer_idx):
            return super().training_step(batch, batch_idx)

    with pytest.raises(RuntimeError, match=r"OldStyle\.training_step takes optimizer_idx: training with multiple "
                                           r"optimizers is only supported with manual optimization\. Remove the "
                                           r"`optimizer_idx` argument from `training_step`"):
        run_trainer(tmp_path, OldStyle(), max_steps=2)


def _two_sgd():
    net = nn.Linear(2, 1)
    return torch.optim.SGD(net.parameters(), lr=0.1), torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1)


class _Stateful:
    """A scheduler that is not torch's (state_dict / load_state_dict, no step of torch's kind)."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


REFUSED = {
    "None": (lambda o, p: None, TypeError, r"returned None\. configure_optimizers may return: an optimizer; "),
    "empty list": (lambda o, p: [], TypeError, r"returned \[\]\. configure_optimizers may return"),
    "scheduler first": (lambda o, p: (StepLR(o, 1), o), TypeError, r"gave optimizer=a StepLR, not a torch\.optim\.Optimizer"),
    "optimizer as lr_scheduler": (lambda o, p: {"optimizer": o, "lr_scheduler": p}, TypeError,
                                  r"a SGD optimizer where a scheduler belongs \(several optimizers need automatic_optimization = False\)"),
    "optimizer in scheduler list": (lambda o, p: ([o], [p]), TypeError, r"a SGD optimizer where a scheduler belongs"),
    "optimizer as scheduler dict's scheduler": (lambda o, p: (o, {"scheduler": p}), TypeError,
                                                r"a SGD optimizer where a scheduler belongs"),
    "not a scheduler": (lambda o, p: (o, "cosine"), TypeError,
                        r"lr_scheduler 'cosine' has no state_dict\(\) / load_state_dict\(\) methods"),
    "not torch's, no lr_scheduler_step": (lambda o, p: (o, _Stateful(o)), MisconfigurationException,
                                          r"lr_scheduler _Stateful doesn't follow PyTorch's LRScheduler API"),
    "unknown dict key": (lambda o, p: {"optimizer": o, "scheduler": StepLR(o, 1)}, ValueError,
                         r"unknown keys \['scheduler'\]; the keys are \['optimizer', 'lr_scheduler', 'monitor'\]"),
    "no optimizer key": (lambda o, p: {"lr_scheduler": StepLR(o, 1)}, ValueError, r"dict has no 'optimizer' key"),
    "unknown scheduler key": (lambda o, p: (o, {"scheduler": StepLR(o, 1), "freq": 2}), ValueError,
                              r"unknown keys \['freq'\]; the keys are \['scheduler', 'name', 'interval', 'frequency'"),
    "no scheduler key": (lambda o, p: (o, {"interval": "step"}), ValueError, r"lr_scheduler dict has no 'scheduler' key"),
    "bad interval": (lambda o, p: (o, {"scheduler": StepLR(o, 1), "interval": "batch"}), ValueError,
                     r"interval='batch'; the intervals are \['step', 'epoch'\]"),
    "frequency 0": (lambda o, p: (o, {"scheduler": StepLR(o, 1), "frequency": 0}), ValueError,
                    r"frequency=0; it must be an integer >= 1"),
    "frequency str": (lambda o, p: (o, {"scheduler": StepLR(o, 1), "frequency": "2"}), ValueError, r"frequency='2'"),
    "frequency bool": (lambda o, p: (o, {"scheduler": StepLR(o, 1), "frequency": True}), ValueError, r"frequency=True"),
    "strict not bool": (lambda o, p: (o, {"scheduler": ReduceLROnPlateau(o), "monitor": "val/loss", "strict": "yes"}),
                        ValueError, r"strict='yes'; it must be True or False"),
    "bad name": (lambda o, p: (o, {"scheduler": StepLR(o, 1), "name": 3}), ValueError, r"name=3; it must be a non-empty"),
    "repeated names": (lambda o, p: ([o], [{"scheduler": StepLR(o, 1), "name": "a"}, {"scheduler": StepLR(o, 2), "name": "a"}]),
                       ValueError, r"lr_scheduler names \['a', 'a'\] repeat"),
    "plateau without monitor": (lambda o, p: (o, ReduceLROnPlateau(o)), ValueError,
                                r"ReduceLROnPlateau needs monitor='val/\.\.\.' .* got monitor=None"),
    "plateau monitor not a name": (lambda o, p: (o, {"scheduler": ReduceLROnPlateau(o), "monitor": 3}),
                                   ValueError, r"or a name the module logs with self.log .* got monitor=3"),
    "reduce_on_plateau on a StepLR": (lambda o, p: (o, {"scheduler": StepLR(o, 1), "reduce_on_plateau": True}),
                                      ValueError, r"reduce_on_plateau=True for a StepLR; it is False"),
    "scheduler of another optimizer": (lambda o, p: (o, StepLR(p, 1)), ValueError,
                                       r"StepLR was built on another optimizer than the one configure_optimizers returned"),
    "list as lr_scheduler": (lambda o, p: {"optimizer": o, "lr_scheduler": [StepLR(o, 1)]}, TypeError,
                             r"'lr_scheduler' is \[a StepLR\]; give one scheduler"),
    "monitor without scheduler": (lambda o, p: {"optimizer": o, "monitor": "val/loss"}, ValueError,
                                  r"monitor='val/loss' without an 'lr_scheduler'"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_is_not_understood_is_an_error_naming_it(case):
    make, error, message = REFUSED[case]
    optimizer, other = _two_sgd()
    with pytest.raises(error, match=message):
        split_optimizers(make(optimizer, other))


@pytest.mark.parametrize("returned", [
    lambda o: (o, {"scheduler": StepLR(o, 1), "monitor": "val/loss"}),
    lambda o: {"optimizer": o, "lr_scheduler": StepLR(o, 1), "monitor": "val/loss"},
    lambda o: (o, {"scheduler": StepLR(o, 1), "strict": False}),
], ids=["monitor", "top-level monitor", "strict"])
def test_a_monitor_on_another_scheduler_is_ignored_with_a_warning(returned, caplog):
    # As Lightning (lightning-hydra-template sets a monitor on every scheduler): it changes nothing for a StepLR.
    optimizer, _ = _two_sgd()
    with caplog.at_level("WARNING"):
        _, (config,) = split_optimizers(returned(optimizer))
    assert isinstance(config.scheduler, StepLR) and config.monitor is None
    assert "only used by ReduceLROnPlateau (it steps with a metric): ignored for this scheduler" in caplog.text


def test_every_lightning_scheduler_key_is_read():
    optimizer, _ = _two_sgd()
    plateau = ReduceLROnPlateau(optimizer)
    _, (config,) = split_optimizers({"optimizer": optimizer, "lr_scheduler": {
        "scheduler": plateau, "frequency": 3, "monitor": "train/loss", "strict": False, "name": "plateau",
        "reduce_on_plateau": True}})
    assert (config.scheduler, config.frequency, config.monitor, config.strict, config.name, config.event) == (
        plateau, 3, "train/loss", False, "plateau", "logging")
    # Lightning's top-level monitor for a bare ReduceLROnPlateau.
    _, (config,) = split_optimizers({"optimizer": optimizer, "lr_scheduler": plateau, "monitor": "val/loss"})
    assert (config.monitor, config.event) == ("val/loss", "validation")


# ----- when the schedulers step ------------------------------------------------------------------------------
def test_frequency_counts_optimizer_steps(tmp_path):
    # Before: frequency was dropped and the scheduler stepped after every optimizer step.
    module = Scheduled(lambda o: {"optimizer": o, "lr_scheduler": {"scheduler": StepLR(o, 1, gamma=0.5), "frequency": 3}})
    run_trainer(tmp_path, module, max_steps=8)
    assert module.lrs == [LR] * 3 + [LR / 2] * 3 + [LR / 4] * 2


def test_epoch_interval_steps_after_every_frequency_finished_epochs(tmp_path):
    # 32 samples, global batch 16: 2 steps per epoch; max_steps=9 cuts epoch 4 short after one step.
    scheduler = []

    def make(o):
        scheduler.append(StepLR(o, 1, gamma=0.5))
        return {"optimizer": o, "lr_scheduler": {"scheduler": scheduler[0], "interval": "epoch", "frequency": 2}}

    module = Scheduled(make, num_samples=32)
    run_trainer(tmp_path, module, max_steps=9, batch_size=16)
    assert module.lrs == [LR] * 4 + [LR / 2] * 4 + [LR / 4]  # stepped after epochs 1 and 3
    assert scheduler[0].last_epoch == 2  # the cut-short epoch 4 is no epoch end


def test_plateau_steps_at_validation_ends_on_the_monitored_metric(tmp_path):
    # mode="max" on a falling val/loss: every counted validation after the first is "no improvement".
    options = dict(mode="max", factor=0.5, patience=0)
    module = Scheduled(lambda o: {"optimizer": o, "lr_scheduler": {
        "scheduler": ReduceLROnPlateau(o, **options), "monitor": "val/loss", "frequency": 2, "interval": "epoch"}},
        val_samples=8)
    run_trainer(tmp_path, module, max_steps=8, val_every_n_steps=1)
    val_loss = rows(tmp_path, "val/loss")
    assert sorted(val_loss) == list(range(1, 9))
    assert module.lrs == plateau_lrs(val_loss, 8, frequency=2, **options)
    assert module.lrs[-1] < LR  # it really reduced


def test_plateau_on_a_training_metric_steps_at_logging_steps(tmp_path):
    options = dict(mode="max", factor=0.5, patience=0)
    module = Scheduled(lambda o: {"optimizer": o, "lr_scheduler": ReduceLROnPlateau(o, **options), "monitor": "train/loss"})
    run_trainer(tmp_path, module, max_steps=9, log_every_n_steps=2)
    train_loss = rows(tmp_path, "train/loss")
    assert sorted(train_loss) == [2, 4, 6, 8, 9]  # (the last step is always a logging step)
    assert module.lrs == plateau_lrs(train_loss, 9, frequency=1, **options)
    assert module.lrs[-1] < LR


def test_schedulers_add_no_host_sync(tmp_path):
    def with_schedulers(o):
        return ([o], [{"scheduler": StepLR(o, 1, gamma=0.9), "frequency": 2},
                      {"scheduler": ReduceLROnPlateau(o, mode="max"), "monitor": "train/loss"},
                      {"scheduler": ReduceLROnPlateau(o, mode="max"), "monitor": "val/loss"}])

    counts = []
    for name, make in [("plain", lambda o: o), ("scheduled", with_schedulers)]:
        with HostSyncCounter() as counter:
            run_trainer(tmp_path / name, Scheduled(make, val_samples=8), max_steps=6, log_every_n_steps=3,
                        val_every_n_steps=2)
        counts.append(counter.count)
    assert counts[0] == counts[1] > 0


@pytest.mark.parametrize("monitor, where, known", [
    ("val/accuracy", "validation metrics", "['val/loss']"),
    ("train/accuracy", "training metrics of logging step 2", "['epoch', "),
])
def test_a_monitor_never_logged_is_an_error_where_it_should_first_be(tmp_path, monitor, where, known):
    module = Scheduled(lambda o: {"optimizer": o, "lr_scheduler": {"scheduler": ReduceLROnPlateau(o), "monitor": monitor}},
                       val_samples=8)
    with pytest.raises(ValueError, match=rf"ReduceLROnPlateau\(monitor='{monitor}'\): '{monitor}' is not among the {where}, "
                                         rf"which are {re.escape(known)}"):
        run_trainer(tmp_path, module, max_steps=8, log_every_n_steps=2, val_every_n_steps=3)
    assert len(module.lrs) == (3 if monitor.startswith("val/") else 2)  # the first validation / logging step


def test_strict_false_skips_a_missing_monitor_with_one_warning(tmp_path, caplog):
    module = Scheduled(lambda o: {"optimizer": o, "lr_scheduler": {
        "scheduler": ReduceLROnPlateau(o, mode="max", patience=0), "monitor": "val/accuracy", "strict": False}},
        val_samples=8)
    with caplog.at_level(logging.WARNING, logger="trainer"):
        run_trainer(tmp_path, module, max_steps=4, val_every_n_steps=1)
    assert module.lrs == [LR] * 4
    assert caplog.text.count("'val/accuracy' is not among the validation metrics") == 1


def test_validation_monitor_without_validation_data_is_an_error_at_fit_start(tmp_path):
    module = Scheduled(lambda o: {"optimizer": o, "lr_scheduler": ReduceLROnPlateau(o), "monitor": "val/loss"})
    with pytest.raises(ValueError, match=r"ReduceLROnPlateau\(monitor='val/loss'\) steps on a validation metric, but "
                                         r"the module has no val_dataset\(\)"):
        run_trainer(tmp_path, module, max_steps=2)
    assert module.lrs == []


class ScheduledOverflow(OverflowAt):
    def __init__(self, fused: bool = False, **kwargs):  # fused: fp16 steps sync-free (test_loss_scaler_tensor.py)
        super().__init__(**kwargs)
        self.lrs: list[float] = []
        self.fused = fused

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=LR, fused=self.fused)
        return optimizer, {"scheduler": StepLR(optimizer, 1, gamma=0.5), "frequency": 2}

    def on_before_optimizer_step(self, optimizer):
        self.lrs.append(optimizer.param_groups[0]["lr"])


def test_a_skipped_fp16_step_neither_steps_nor_counts_for_the_scheduler(tmp_path):
    module = ScheduledOverflow(bad_step=3)
    run_trainer(tmp_path, module, max_steps=6, batch_size=16,
                precision=Precision("fp16-mixed", initial_scale_power=10, hysteresis=1))
    assert rows(tmp_path, "train/skipped_steps")[6] == 1
    # Optimizer steps 1, 2, 4, 5, 6 (step 3 skipped): the scheduler steps after the 2nd and 4th of them.
    assert module.lrs == [LR, LR, LR / 2, LR / 2, LR / 4]


def test_lr_monitor_logs_under_the_schedulers_name(tmp_path):
    module = Scheduled(lambda o: {"optimizer": o, "lr_scheduler": {"scheduler": StepLR(o, 1, gamma=0.5), "name": "decay"}})
    run_trainer(tmp_path, module, max_steps=3, callbacks=[LearningRateMonitor()])
    assert rows(tmp_path, "decay/group0") == {1: LR / 2, 2: LR / 4, 3: LR / 8}
    assert rows(tmp_path, "lr/group0") == {}


# ----- checkpoints ---------------------------------------------------------------------------------------------
def three_schedulers(o):
    """Per 3 optimizer steps, per epoch, and on val/loss every 3 validations: all stepping state matters."""
    return ([o], [{"scheduler": StepLR(o, 1, gamma=0.8), "frequency": 3},
                  {"scheduler": StepLR(o, 1, gamma=0.5), "interval": "epoch"},
                  {"scheduler": ReduceLROnPlateau(o, mode="max", factor=0.9, patience=0), "monitor": "val/loss",
                   "frequency": 3}])


def test_resumed_run_steps_its_schedulers_as_the_uninterrupted_run(tmp_path):
    # 64 samples, global batch 16: 4 steps per epoch; validation every 2 steps. The checkpoint at
    # step 5 is mid-epoch, between two steps of the per-3-steps scheduler and two counted validations.
    args = dict(batch_size=16, val_every_n_steps=2)
    whole = Scheduled(three_schedulers, num_samples=64, val_samples=8)
    run_trainer(tmp_path / "whole", whole, max_steps=10, **args)
    first = Scheduled(three_schedulers, num_samples=64, val_samples=8)
    run_trainer(tmp_path / "first", first, max_steps=5, checkpoint=dict(every_n_steps=5), **args)
    checkpoint = layout.find_latest(str(tmp_path / "first" / "checkpoints"))
    assert checkpoint.endswith("step-000000005")
    resumed = Scheduled(three_schedulers, num_samples=64, val_samples=8)
    run_trainer(tmp_path / "resumed", resumed, max_steps=10, resume=checkpoint, **args)
    assert first.lrs + resumed.lrs == whole.lrs
    assert len(set(whole.lrs[5:])) > 1  # the schedulers moved after the resume point
    losses, resumed_losses = rows(tmp_path / "whole", "train/loss"), rows(tmp_path / "resumed", "train/loss")
    assert [resumed_losses[s] for s in range(6, 11)] == [losses[s] for s in range(6, 11)]


def test_checkpoint_scheduler_state_from_before_the_counters_loads():
    optimizer, _ = _two_sgd()
    old = LambdaLR(optimizer, lambda step: 0.5 ** step)
    for _ in range(3):
        optimizer.step()
        old.step()
    fresh_optimizer, _ = _two_sgd()
    _, configs = split_optimizers((fresh_optimizer, LambdaLR(fresh_optimizer, lambda step: 0.5 ** step)))
    scheduling = LRScheduling(configs)
    scheduling.load_state_dict(old.state_dict())
    assert configs[0].scheduler.last_epoch == 3 and scheduling.events == [0]


def test_ranks_step_their_schedulers_together_as_one_process(tmp_path):
    # The monitored val/loss is reduced over the ranks: both DDP ranks take the decisions one process takes.
    args = dict(max_steps=8, val_every_n_steps=1)
    run_trainer(tmp_path / "one", Scheduled(three_schedulers, num_samples=64, val_samples=8), batch_size=16, **args)
    run_trainer(tmp_path / "ddp", Scheduled(three_schedulers, num_samples=64, val_samples=8), batch_size=8,
                strategy="ddp", devices=2, **args)
    one, *ranks = (json.load(open(tmp_path / d / f"lrs_rank{r}.json")) for d, r in [("one", 0), ("ddp", 0), ("ddp", 1)])
    assert ranks[0] == ranks[1] == one
    assert len(set(one)) > 2


def test_checkpoint_of_other_schedulers_is_not_loaded_and_says_so(caplog):
    optimizer, _ = _two_sgd()
    saved = LRScheduling([split_optimizers((optimizer, StepLR(optimizer, 1)))[1][0]])
    saved.events = [4]
    fresh_optimizer, _ = _two_sgd()
    _, configs = split_optimizers((fresh_optimizer, {"scheduler": ReduceLROnPlateau(fresh_optimizer), "monitor": "val/loss"}))
    scheduling = LRScheduling(configs)
    with caplog.at_level(logging.WARNING, logger="trainer"):
        scheduling.load_state_dict(saved.state_dict())
    assert scheduling.events == [0]
    assert "the checkpoint's lr schedulers ['StepLR'] differ from this run's ['ReduceLROnPlateau']" in caplog.text


def test_interval_on_reduce_on_plateau_and_validation_once_at_the_end_warn(caplog):
    optimizer, _ = _two_sgd()
    with caplog.at_level(logging.WARNING, logger="trainer"):
        _, configs = split_optimizers((optimizer, {"scheduler": ReduceLROnPlateau(optimizer), "monitor": "val/loss",
                                                   "interval": "epoch"}))
        LRScheduling(configs).check_fit(has_val_set=True, validates_during_training=False, rank=0)
    assert "interval='epoch' is not used; it steps when its monitor is computed (each validation end)" in caplog.text
    assert "so validation (and this scheduler) runs only once, at the end of training" in caplog.text


@pytest.mark.parametrize("setting", [{"val_every_n_steps": 2}, {"val_check_interval": 0.5},
                                     {"check_val_every_n_epoch": 1}])
def test_plateau_on_validation_says_once_at_the_end_only_when_true(tmp_path, caplog, setting):
    """The warning is given only where validation runs once; with validation during training the
    scheduler steps at each validation end (counted), and no warning says otherwise."""

    class Plateau(Regressor):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            self.plateau = ReduceLROnPlateau(optimizer)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": self.plateau, "monitor": "val/loss"}}

    module = Plateau(num_samples=64, val_samples=16)
    with caplog.at_level(logging.WARNING, logger="trainer"):
        new_trainer(tmp_path, max_steps=-1, max_epochs=2, batch_size=16, num_sanity_val_steps=0, **setting).fit(module)
    assert "runs only once, at the end of training" not in caplog.text
    assert module.plateau.last_epoch >= 2  # stepped at more validation ends than the final one
