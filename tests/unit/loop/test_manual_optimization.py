"""Manual optimization (``automatic_optimization = False``) and several optimizers: the GAN recipe's
module trains the same in one process and on 2 DDP ranks (and FSDP), hand accumulation skips the
gradient sync, fp16 overflows skip the step, checkpoints resume exactly, and what is refused says so."""

from __future__ import annotations

import json
import logging
import math
import os
import subprocess
import sys
from functools import partial

import pytest
import torch

from tests.support.helpers import REPO, HotPathProbe, read_hot_path, read_metrics, run_trainer
from tests.support.manual_modules import CountingGAN, HandAccumulatingGAN, OverflowingGAN, tiny_gan
from trainer.recipes.gan import DigitsGAN
from trainer.runtime.comms_log import GRADIENT_KIND
from trainer.optim.optimizers import split_manual, split_optimizers
from trainer.precision import Precision
from trainer.strategies.ddp import DDPStrategy
from trainer.strategies.fsdp import FSDPStrategy

pytestmark = pytest.mark.timeout(300)

STEPS = 8  # 197 samples in global batches of 32: batch 7 is the short last one (5 samples, uneven over 2 ranks)
GLOBAL = 32
# The GAN steps both optimizers every batch: global_step (and max_steps) counts 2 per batch (as Lightning).
OPT_STEPS = 2 * STEPS


def gan_run(run_dir, devices: int = 1, strategy="single", module=None, **args):
    module = module if module is not None else tiny_gan()
    run_trainer(run_dir, module, strategy=strategy, devices=devices, batch_size=GLOBAL // devices,
                **dict(dict(max_steps=OPT_STEPS), **args))
    rows = [r for r in read_metrics(str(run_dir)) if "train/d_loss" in r]
    return [(r["train/d_loss"], r["train/g_loss"]) for r in rows], {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_close_states(a, b, atol):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=atol, msg=lambda m, n=name: f"{n}: {m}")


def test_gan_ddp_equals_one_process(tmp_path):
    single, ddp = CountingGAN(), CountingGAN()
    single_losses, single_state = gan_run(tmp_path / "single", module=single)
    ddp_losses, ddp_state = gan_run(tmp_path / "ddp", devices=2, strategy=DDPStrategy(), module=ddp)
    # global_step counts optimizer steps on every rank alike (min == max over the ranks), 1 process == 2 ranks.
    assert single.global_step == ddp.global_step == OPT_STEPS
    for run_dir in ("single", "ddp"):
        counted = [(r["step"], r["global_step_min"], r["global_step_max"]) for r in read_metrics(str(tmp_path / run_dir))
                   if "global_step_min" in r]
        assert counted == [(b, 2.0 * b, 2.0 * b) for b in range(1, STEPS + 1)], (run_dir, counted)
    assert len(single_losses) == STEPS and all(map(math.isfinite, sum(single_losses, ())))
    # Each rank's loss is its micro-batch mean; manual_backward weights it by its real samples, so the
    # short uneven step 7 (and everything after it) matches one process on the same global batch.
    torch.testing.assert_close(torch.tensor(ddp_losses), torch.tensor(single_losses), rtol=0, atol=1e-5)
    assert_close_states(ddp_state, single_state, atol=1e-5)
    assert len(set(single_losses)) == STEPS  # it trains: every step's losses differ


def test_gan_fsdp_trains_like_one_process(tmp_path):
    single_losses, single_state = gan_run(tmp_path / "single")
    fsdp_losses, fsdp_state = gan_run(tmp_path / "fsdp", devices=2, strategy=FSDPStrategy(sharding="full"))
    assert all(map(math.isfinite, sum(fsdp_losses, ())))
    torch.testing.assert_close(torch.tensor(fsdp_losses), torch.tensor(single_losses), rtol=0, atol=1e-5)
    assert_close_states(fsdp_state, single_state, atol=1e-5)


def comms(run_dir) -> dict:
    with open(os.path.join(str(run_dir), "comms", "rank0.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("strategy, gradient_kind", [
    (DDPStrategy, "all_reduce (gradients)"),
    (lambda: FSDPStrategy(sharding="full"), "reduce_scatter"),
])
def test_no_backward_sync_skips_the_gradient_sync(tmp_path, strategy, gradient_kind):
    states, counts = {}, {}
    for skip in (True, False):
        run_dir = tmp_path / str(skip)
        module = HandAccumulatingGAN(skip_sync=skip)
        run_trainer(run_dir, module, strategy=strategy(), devices=2, batch_size=16, max_steps=4,
                    log_every_n_steps=100, profile={"comms_steps": [3, 4]})
        counts[skip] = comms(run_dir)["kinds"][gradient_kind]["count"]
        states[skip] = {k: v.detach().clone() for k, v in module.state_dict().items()}
    # Two backward passes per step: synced once with no_backward_sync, twice without.
    assert counts[True] >= 2 and counts[False] == 2 * counts[True], counts
    assert_close_states(states[True], states[False], atol=1e-6)  # the sync skipped, the same gradients


def test_quiet_manual_steps_make_no_new_host_sync(tmp_path):
    # DDP, fp16: on a step that does not log, the only host reads are the overflow decisions (one
    # per optimizer step, as the automatic path's one per step) and the only collectives the gradients'.
    run_trainer(tmp_path, tiny_gan(), strategy=DDPStrategy(), devices=2, batch_size=8, max_steps=12,  # 6 batches
                log_every_n_steps=3, precision=Precision("fp16-mixed", initial_scale_power=8), callbacks=[HotPathProbe()])
    for rank, windows in enumerate(read_hot_path(tmp_path, 2)):
        for step in (2, 5):
            window = windows[step]
            assert window["syncs"] == 2 and all(w.startswith("fp16_step.py") for w in window["where"]), (rank, window)
            assert set(window["collectives"]) == {GRADIENT_KIND}, (rank, window["collectives"])


@pytest.mark.parametrize("fused", [False, True])
def test_fp16_overflow_skips_the_step(tmp_path, fused):
    # fused: opt.step() passes the device overflow flag to the fused SGD, which skips in its kernel.
    module = OverflowingGAN(bad_batch=2)
    if fused:
        module.optimizer_factory = partial(torch.optim.SGD, lr=0.05, fused=True)
    run_trainer(tmp_path, module, batch_size=16, max_steps=5, precision=Precision("fp16-mixed", initial_scale_power=8))
    metrics = [r for r in read_metrics(str(tmp_path)) if "train/skipped_steps" in r]
    assert [r["train/skipped_steps"] for r in metrics] == [0, 0, 1, 1, 1]
    sums = dict(module.seen)
    assert sums[2] == sums[1] and sums[3] != sums[2]  # the overflowing step left the weights alone
    assert all(math.isfinite(s) for s in sums.values())


def test_checkpoint_resume_of_a_manual_run_is_exact(tmp_path):
    # Both optimizers' states (Adam moments) and both schedulers (stepped by the module) are saved.
    def module():
        return tiny_gan(scheduler=partial(torch.optim.lr_scheduler.StepLR, step_size=3, gamma=0.5))

    def lrs(run_dir):
        return [(r["train/lr/optimizer0"], r["train/lr/optimizer1"]) for r in read_metrics(str(run_dir))
                if "train/lr/optimizer0" in r]

    straight_losses, straight_state = gan_run(tmp_path / "straight", module=module())
    gan_run(tmp_path / "first", module=module(), max_steps=8, checkpoint=dict(every_n_steps=8))  # 4 batches
    resumed_losses, resumed_state = gan_run(tmp_path / "resumed", module=module(),
                                            resume=str(tmp_path / "first" / "checkpoints"))
    assert resumed_losses == straight_losses[4:]
    assert_close_states(resumed_state, straight_state, atol=0)
    assert lrs(tmp_path / "resumed") == lrs(tmp_path / "straight")[4:] and lrs(tmp_path / "straight")[-1][0] == 1e-3 / 4


def test_several_optimizers_need_manual_optimization(caplog):
    first, second = (torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1) for _ in range(2))
    for shape in ([first, second], ([first, second], []), [{"optimizer": first}, {"optimizer": second}]):
        with pytest.raises(TypeError, match="2 optimizers.*self.automatic_optimization = False"):
            split_optimizers(shape)
        optimizers, configs = split_manual(shape)
        assert optimizers == [first, second] and configs == []
    scheduler = torch.optim.lr_scheduler.StepLR(second, 1)
    optimizers, configs = split_manual(([first, second], [scheduler]))
    assert [c.scheduler for c in configs] == [scheduler]
    with pytest.raises(ValueError, match=r"keys \['bogus'\] with manual optimization"):
        split_manual([{"optimizer": first, "lr_scheduler": {"scheduler": scheduler, "bogus": "epoch"}}])
    # Lightning's keys that say when the trainer would step it: accepted with one warning (the module steps it).
    # As Lightning's: the keys dropped (monitor, strict, reduce_on_plateau) are named by a RuntimeWarning;
    # interval / frequency are kept (for LearningRateMonitor) and a log record says they do not step it.
    with caplog.at_level(logging.WARNING), pytest.warns(RuntimeWarning, match=r"\['monitor'\], but the keys will be"):
        _, configs = split_manual([{"optimizer": second, "lr_scheduler": {"scheduler": scheduler, "interval": "epoch",
                                                                         "monitor": "loss"}}])
    assert "['interval'] do not step the scheduler under manual optimization" in caplog.text
    assert configs[0].interval == "epoch" and configs[0].monitor is None
    sharing = torch.optim.SGD(first.param_groups[0]["params"], lr=0.1)  # (allowed: refused only under fp16)
    assert split_manual([first, sharing])[0] == [first, sharing]


class SharedGAN(DigitsGAN):
    """The generator's optimizer also steps the discriminator's last layer, which the discriminator's
    optimizer steps too (two optimizers sharing parameters, as Lightning allows)."""

    def configure_optimizers(self):
        shared = list(self.discriminator.parameters())[-2:]
        return [self.optimizer_factory(list(self.generator.parameters()) + shared),
                self.optimizer_factory(self.discriminator.parameters())]


def test_optimizers_sharing_a_parameter_train_alike_on_one_process_and_two_ranks(tmp_path):
    single_losses, single_state = gan_run(tmp_path / "single", module=tiny_gan(SharedGAN))
    ddp_losses, ddp_state = gan_run(tmp_path / "ddp", devices=2, strategy=DDPStrategy(), module=tiny_gan(SharedGAN))
    torch.testing.assert_close(torch.tensor(ddp_losses), torch.tensor(single_losses), rtol=0, atol=1e-5)
    assert_close_states(ddp_state, single_state, atol=1e-5)
    _, unshared_state = gan_run(tmp_path / "unshared")  # the sharing is used: the weights differ without it
    last = list(single_state)[-1]
    assert not torch.allclose(single_state[last], unshared_state[last], atol=1e-4)


def test_optimizers_sharing_a_parameter_under_fp16_are_refused(tmp_path):
    with pytest.raises(ValueError, match="share a parameter.*unscale twice"):
        gan_run(tmp_path, module=tiny_gan(SharedGAN), precision="16-mixed")


@pytest.mark.parametrize("args, message", [
    (dict(accumulate_grad_batches=2), "accumulate_grad_batches=2.*accumulate by hand"),
    (dict(gradient_clip_val=1.0), "gradient_clip_val=1.0 with manual optimization.*self.clip_gradients"),
])
def test_manual_optimization_refusals(tmp_path, args, message):
    with pytest.raises(ValueError, match=message):
        run_trainer(tmp_path, tiny_gan(), batch_size=8, max_steps=2, **args)


def test_gan_recipe_runs_from_the_command_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "train.py", "recipe=gan", "trainer.max_steps=5", "trainer.log_every_n_steps=5",
         f"hydra.run.dir={tmp_path}", "trainer.progress_bar=false"],
        cwd=REPO, capture_output=True, text=True, timeout=240, env=dict(os.environ, PYTHONPATH=REPO),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [r for r in read_metrics(str(tmp_path)) if "train/d_loss" in r]
    assert len(rows) == 1 and rows[0]["train/g_loss"] > 0 and math.isfinite(rows[0]["train/d_loss"])


def test_lr_monitor_logs_every_optimizer(tmp_path):
    from trainer.callbacks import LearningRateMonitor

    run_trainer(tmp_path, tiny_gan(), batch_size=16, max_steps=2, callbacks=[LearningRateMonitor()])
    logged = {k for r in read_metrics(str(tmp_path)) for k in r}
    assert {"lr/optimizer0/group0", "lr/optimizer1/group0", "train/lr/optimizer0", "train/lr/optimizer1"} <= logged


def test_bf16_and_a_step_that_returns_nothing(tmp_path):
    class Quiet(DigitsGAN):
        def training_step(self, batch, batch_idx):
            super().training_step(batch, batch_idx)  # steps both optimizers, returns nothing to log

    run_trainer(tmp_path / "quiet", tiny_gan(Quiet), batch_size=16, max_steps=2)
    assert all("train/d_loss" not in r for r in read_metrics(str(tmp_path / "quiet")))
    losses, _ = gan_run(tmp_path / "bf16", max_steps=6, precision="bf16-mixed")  # 3 batches
    assert len(losses) == 3 and all(map(math.isfinite, sum(losses, ())))


def test_manual_refusals_of_strategies_and_normalisation():
    from types import SimpleNamespace

    from trainer.loop.manual_step import check_manual_setup

    trainer = SimpleNamespace(accumulate_grad_batches=1, gradient_clip_val=None, loss_normalization="samples")
    plain = SimpleNamespace(owns_step=False, name="ddp", zero1=False)
    two = [object(), object()]
    check_manual_setup(trainer, plain, two)  # accepted
    with pytest.raises(ValueError, match="strategy=pipeline runs each micro-batch's forward and backward itself"):
        check_manual_setup(trainer, SimpleNamespace(owns_step=True, name="pipeline"), two)
    with pytest.raises(ValueError, match="strategy.zero1=true with 2 optimizers"):
        check_manual_setup(trainer, SimpleNamespace(owns_step=False, name="ddp", zero1=True), two)
    with pytest.raises(ValueError, match="loss_normalization='tokens' with manual optimization"):
        check_manual_setup(SimpleNamespace(**dict(vars(trainer), loss_normalization="tokens")), plain, two)


def test_optimizers_and_lr_schedulers_read_under_automatic_optimization(tmp_path):
    from tests.support.helpers import Regressor

    class Reading(Regressor):
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
            return optimizer, torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)

        def on_train_step_end(self, step, metrics):
            self.read = (self.optimizers().param_groups[0]["lr"], self.lr_schedulers().last_epoch)

        def training_step(self, batch, batch_idx):
            with pytest.raises(RuntimeError, match=r"manual_backward\(\) is for manual optimization"):
                self.manual_backward(torch.zeros(()))
            return super().training_step(batch, batch_idx)

    module = Reading()
    run_trainer(tmp_path, module, max_steps=3)
    assert module.read == (0.1 / 8, 3)


def test_fp16_manual_optimization_under_fsdp_trains_like_one_process(tmp_path):
    # fp16 loss scaling with two optimizers under FSDP: each opt.step() unscales its own (sharded)
    # gradients and agrees on overflows over the ranks; the losses follow one process's fp16 run.
    fp16 = dict(precision=Precision("fp16-mixed", initial_scale_power=8))
    single_losses, _ = gan_run(tmp_path / "single", **fp16)
    fsdp_losses, _ = gan_run(tmp_path / "fsdp", devices=2, strategy=FSDPStrategy(sharding="full"), **fp16)
    assert len(fsdp_losses) == STEPS and all(map(math.isfinite, sum(fsdp_losses, ())))
    # fp16 matmuls round differently on another batch split (measured: 3e-3 apart over 8 steps).
    torch.testing.assert_close(torch.tensor(fsdp_losses), torch.tensor(single_losses), rtol=0, atol=5e-3)
    assert abs(single_losses[-1][0] - single_losses[0][0]) > 0.02  # what it trains is larger than the tolerance
    scales = [r["train/loss_scale"] for r in read_metrics(str(tmp_path / "fsdp")) if "train/loss_scale" in r]
    assert scales and scales[0] == 2.0 ** 8


def test_global_step_counts_optimizer_steps_and_resumes(tmp_path, caplog):
    # Two opt.step() per batch: max_steps=6 is 3 batches; every_n_steps=2 saves after every batch (folders
    # named by batches); the logged step axis counts batches. A cosine schedule of max_steps=6 steps that
    # the module steps once per batch would stop halfway: said once. Resuming mid-run restores global_step.
    import logging
    import shutil

    from tests.support.helpers import new_trainer

    def module():
        return CountingGAN(scheduler=partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=6))

    def fit(run_dir, ckpt_path=None, **args):
        gan = module()
        trainer = new_trainer(run_dir, batch_size=16, max_steps=6, **args)
        trainer.fit(gan, ckpt_path=ckpt_path)
        losses = [(r["step"], r["train/d_loss"], r["train/g_loss"]) for r in read_metrics(str(run_dir)) if "train/d_loss" in r]
        return trainer, gan, losses

    with caplog.at_level(logging.WARNING, logger="trainer"):
        trainer, straight, straight_losses = fit(tmp_path / "straight", checkpoint=dict(every_n_steps=2, keep_last=None))
    assert trainer.global_step == straight.global_step == 6 and straight.seen == [(0, 2), (2, 4), (4, 6)]
    assert [step for step, *_ in straight_losses] == [1, 2, 3] and straight.estimated == 6
    assert "CosineAnnealingLR spans 6 steps (trainer.max_steps=6)" in caplog.text and "length of 3" in caplog.text
    root = tmp_path / "straight" / "checkpoints"
    saved = {p.name: json.loads((p / "trainer_state.json").read_text()) for p in root.iterdir() if p.name.startswith("step-")}
    assert {name: (s["step"], s["global_step"]) for name, s in saved.items()} == {
        "step-000000001": (1, 2), "step-000000002": (2, 4), "step-000000003": (3, 6)}

    # Logging every 100 batches: the last batch (foreseen from the steps per batch) is logged all the same.
    trainer, resumed, resumed_losses = fit(tmp_path / "resumed", ckpt_path=str(root / "step-000000002"),
                                           log_every_n_steps=100)
    assert resumed.seen == [(4, 6)] and trainer.global_step == 6
    assert resumed_losses == straight_losses[2:]
    assert_close_states(resumed.state_dict(), straight.state_dict(), atol=0)

    # A checkpoint written before global_step was saved: global_step restarts from its batches (2 here).
    old = tmp_path / "old" / "step-000000002"
    shutil.copytree(root / "step-000000002", old)
    state = json.loads((old / "trainer_state.json").read_text())
    del state["global_step"]
    (old / "trainer_state.json").write_text(json.dumps(state))
    marker = json.loads((old / "COMMITTED").read_text())
    marker["files"]["trainer_state.json"] = (old / "trainer_state.json").stat().st_size  # (sizes are checked)
    (old / "COMMITTED").write_text(json.dumps(marker))
    trainer, from_old, old_losses = fit(tmp_path / "from_old", ckpt_path=str(old), log_every_n_steps=100)
    assert from_old.seen == [(2, 4), (4, 6)] and trainer.global_step == 6 and [r[0] for r in old_losses] == [4]


def test_estimated_stepping_batches_under_manual_optimization_with_epochs(tmp_path):
    # With an epoch bound the optimizer steps are unknown up front: an error, not a batch count.
    # every_n_steps=4 with 2 optimizer steps per batch: saves after batches 2 and 4 only.
    gan = CountingGAN()
    run_trainer(tmp_path, gan, batch_size=64, max_steps=-1, max_epochs=1,
                checkpoint=dict(every_n_steps=4, save_last=False, keep_last=None))
    assert "max_epochs=1 (4 batches)" in gan.estimated and "depend on how often training_step calls opt.step()" in gan.estimated
    assert gan.global_step == 8 and gan.seen[-1] == (6, 8)  # 4 batches of one epoch, 2 optimizer steps each
    saved = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("step-"))
    assert saved == ["step-000000002", "step-000000004"]


def test_unequal_step_counts_are_named_by_rank():
    from trainer.loop.step_counts import check_equal

    check_equal([5, 5, 5], step=3)  # equal: nothing
    with pytest.raises(RuntimeError, match=r"by batch 3 \(global_step per rank: rank 0, 2: 5; rank 1: 6\)"):
        check_equal([5, 6, 5], step=3)
