"""Two GANs with manual optimization in Lightning's idioms (tests/support/lightning_gans.py): the
discriminator called three times per step, and toggle_optimizer with a DataModule. Each trains on
2 DDP ranks and on 2 FSDP ranks as in one process (losses and parameters, 15 steps, 1e-5), and no
``opt.step()`` under any strategy runs without a gradient one process gives (an optimizer step
pre-hook records, per step, which parameters of that optimizer have one)."""

from __future__ import annotations

import json

import pytest
import torch

from tests.support.helpers import new_trainer, read_metrics
from tests.support.lightning_gans import GANData, RecordingThreeCallGAN, RecordingToggleGAN
from trainer.strategies.ddp import DDPStrategy
from trainer.strategies.fsdp import FSDPStrategy

pytestmark = pytest.mark.timeout(300)

BATCHES = 15  # one epoch of 240 samples in global batches of 16
GLOBAL = 16
STRATEGIES = {
    "ddp": lambda: DDPStrategy(),
    "fsdp": lambda: FSDPStrategy(),  # no declared blocks: every network layer its own unit
    "fsdp_grad_op": lambda: FSDPStrategy(sharding="grad_op", wrap=["Sequential"]),  # G and D units, kept gathered
}


def fit_gan(run_dir, gan: str, strategy="single", devices: int = 1):
    """Fit one GAN for 15 batches; returns its logged (d_loss, g_loss) per step, its parameters and
    the gradient records of every rank."""
    run_dir.mkdir(parents=True)
    if gan == "three_calls":
        module = RecordingThreeCallGAN(record_dir=str(run_dir), batch_size=GLOBAL // devices, num_samples=240)
        datamodule = None
    else:
        module = RecordingToggleGAN(record_dir=str(run_dir))
        datamodule = GANData(batch_size=GLOBAL // devices, num_samples=240)
    trainer = new_trainer(run_dir, strategy=strategy, devices=devices, max_steps=2 * BATCHES)  # 2 opt.step per batch
    trainer.fit(module, datamodule=datamodule)
    losses = [(r["d_loss"], r["g_loss"]) for r in read_metrics(str(run_dir)) if "d_loss" in r]
    grads = [json.loads((run_dir / f"grads_rank{rank}.json").read_text()) for rank in range(devices)]
    return torch.tensor(losses), {k: v.detach().clone() for k, v in module.state_dict().items()}, grads


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    cache: dict = {}

    def get(gan: str):
        if gan not in cache:
            get.run_dirs[gan] = tmp_path_factory.mktemp(f"single_{gan}") / "run"
            cache[gan] = fit_gan(get.run_dirs[gan], gan)
        return cache[gan]
    get.run_dirs = {}
    return get


@pytest.mark.parametrize("gan", ["three_calls", "toggle"])
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_gan_on_two_ranks_trains_as_one_process(tmp_path, one_process, gan, strategy):
    single_losses, single_state, (single_grads,) = one_process(gan)
    assert single_losses.shape == (BATCHES, 2) and torch.isfinite(single_losses).all()
    assert len(set(single_losses[:, 0].tolist())) == BATCHES  # it trains: every step's loss differs
    # The guard: one record per opt.step (2 per batch), each with the gradients one process has ...
    assert len(single_grads) == 2 * BATCHES and all(names for _, names in single_grads), single_grads[:4]
    losses, state, grads = fit_gan(tmp_path / strategy, gan, STRATEGIES[strategy](), devices=2)
    # ... and on every rank of 2 the same parameters have a gradient at every step.
    for rank, records in enumerate(grads):
        missing = [(i, index, sorted(set(names) - set(got))) for i, ((index, names), (_, got))
                   in enumerate(zip(single_grads, records)) if set(names) - set(got)]
        assert not missing, f"rank {rank}: opt.step() without the gradients one process has: {missing[:3]}"
        assert len(records) == len(single_grads)
    torch.testing.assert_close(losses, single_losses, rtol=1e-5, atol=1e-5)
    if gan == "toggle":  # on_train_epoch_end calls self(z) outside any step (FSDP: its units gather themselves)
        samples = [[r["sample_mean"] for r in read_metrics(str(run_dir)) if "sample_mean" in r]
                   for run_dir in (tmp_path / strategy, one_process.run_dirs[gan])]
        assert len(samples[1]) == 1 and samples[0] == pytest.approx(samples[1], rel=1e-5, abs=1e-6)
    assert state.keys() == single_state.keys()
    for name in state:
        torch.testing.assert_close(state[name], single_state[name], rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")
    assert not torch.equal(state["generator.0.weight"], RecordingToggleGAN(record_dir="").generator[0].weight
                           if gan == "toggle" else RecordingThreeCallGAN(record_dir="").generator[0].weight)


def test_forward_from_epoch_end_hooks_under_fsdp(tmp_path):
    # Automatic optimization, the root holding every parameter: self(x) in on_train_epoch_end and
    # on_validation_epoch_end gathers them as a training step does, and gives what one process gives.
    from tests.support.lightning_gans import EpochEndRegressor

    logged = []
    for name, strategy, devices in (("single", "single", 1), ("fsdp", FSDPStrategy(), 2)):
        new_trainer(tmp_path / name, strategy=strategy, devices=devices, batch_size=16 // devices,
                    max_steps=26).fit(EpochEndRegressor(val_samples=16))  # 2 epochs of 13 batches
        logged.append([r.get("train_end_forward", r.get("val_end_forward")) for r in read_metrics(str(tmp_path / name))
                       if "train_end_forward" in r or "val_end_forward" in r])
    # two train epoch ends, and the validation after the last one
    assert len(logged[0]) == 3 and len(logged[1]) == len(logged[0])
    assert logged[0][0] != logged[0][1]  # the weights changed between the epochs
    assert logged[1] == pytest.approx(logged[0], rel=1e-5, abs=1e-6)


def test_module_parameters_of_its_own_are_refused_under_fsdp_manual_optimization(tmp_path):
    from tests.support.lightning_gans import OwnParameterGAN

    with pytest.raises(Exception, match=r"the module holds the parameters \['scale'\] itself.*move them into a submodule"):
        new_trainer(tmp_path, strategy=FSDPStrategy(), devices=2, max_steps=2).fit(
            OwnParameterGAN(batch_size=8, num_samples=32))


def test_a_step_inside_no_backward_sync_is_refused(tmp_path):
    from tests.support.lightning_gans import SteppingInsideNoSync

    with pytest.raises(RuntimeError, match=r"opt.step\(\) inside self.no_backward_sync\(\)"):
        new_trainer(tmp_path, max_steps=2).fit(SteppingInsideNoSync(batch_size=8, num_samples=32))
