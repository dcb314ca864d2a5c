"""SyncBatchNorm on 2 CPU ranks (gloo) == one BatchNorm over the concatenated batch in one process.

All multi-rank work runs in one spawn of 2 workers (``trainer.runtime.launch.spawn``, 127.0.0.1, gloo,
every collective with a 60 s process-group timeout); the single-process references are computed
here. Each rank backpropagates what the trainer backpropagates: its local mean loss x
``n_local x W / N`` (for equal local batches, just the local mean over 16). The sum over ranks of
those objectives is W x the mean loss over the whole batch, so
  - input gradients on each rank = W x the single-process input gradient of its samples,
  - weight/bias gradients summed over ranks = W x the single-process ones; DDP's average of them
    (sum / W) is the single-process gradient exactly.

Tolerances (``torch.testing.assert_close``: |actual - expected| <= atol + rtol x |expected|): all
fp32 on the CPU; the only difference from the reference is summation order (two local reductions
and an all-reduce instead of one reduction over the whole batch), a few ulps. One forward/backward:
rtol 1e-6, atol 2e-6 (measured worst: 7.2e-7 absolute, on outputs of magnitude ~5). 15 SGD steps
with momentum may let that drift grow: rtol 1e-5, atol 5e-6 (measured worst: 4.8e-7 on the
parameters, 2.4e-7 on the losses). The negative controls (plain BatchNorm per rank) must differ by
more than 100 x atol; they differ by 6e-3 to 0.37.

The last test runs the cnn recipe through the Trainer itself (DDP, 2 ranks x 32 vs 1 process x 64,
30 steps) with the same training tolerance; measured: 4.8e-7 on the losses, 9.5e-7 on the state,
against 0.067 and 0.089 for the same DDP run without conversion.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from functools import partial

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from tests.support.helpers import train_losses
from trainer.recipes.cnn import DigitsCNN
from trainer import Trainer
from trainer.runtime.launch import spawn
from trainer.strategies.sync_batchnorm import SyncBatchNorm, SyncBatchNorm1d, convert_sync_batchnorm

pytestmark = pytest.mark.timeout(240)

WORLD = 2
TIMEOUT = timedelta(seconds=60)
RTOL, ATOL = 1e-6, 2e-6  # one forward/backward: summation order only
TRAIN_RTOL, TRAIN_ATOL = 1e-5, 5e-6  # 15 SGD steps with momentum
TRAIN_STEPS = 15
FORWARDS = 2  # training forwards per case: the second exercises the running-stat update again


@dataclass(frozen=True)
class Case:
    bn: type
    sample_shape: tuple  # (C, *spatial)
    sizes: tuple  # local batch size of each rank
    momentum: float | None = 0.1
    affine: bool = True
    convert: bool = True  # False: the negative control (plain BatchNorm on each rank)
    seed: int = 0


CASES = {
    "2d": Case(nn.BatchNorm2d, (4, 5, 5), (16, 16), seed=1),
    "2d_cumulative_average": Case(nn.BatchNorm2d, (4, 5, 5), (16, 16), momentum=None, seed=2),
    "2d_no_affine": Case(nn.BatchNorm2d, (4, 5, 5), (16, 16), affine=False, seed=3),
    "1d_nc": Case(nn.BatchNorm1d, (6,), (16, 16), seed=4),
    "1d_ncl": Case(nn.BatchNorm1d, (6, 7), (16, 16), seed=5),
    "3d": Case(nn.BatchNorm3d, (3, 2, 3, 3), (16, 16), seed=6),
    "2d_uneven": Case(nn.BatchNorm2d, (4, 5, 5), (10, 22), seed=7),
    "1d_nc_uneven": Case(nn.BatchNorm1d, (6,), (10, 22), seed=8),
    "1d_ncl_uneven": Case(nn.BatchNorm1d, (6, 7), (22, 10), momentum=None, seed=9),
    # Negative control: the same data as "2d", no conversion.
    "2d_unconverted": Case(nn.BatchNorm2d, (4, 5, 5), (16, 16), convert=False, seed=1),
}


# ----- the data and modules, identical in the workers and here -----------------------------------
def make_bn(case: Case) -> nn.Module:
    """A batch norm with non-trivial weight, bias and running statistics."""
    generator = torch.Generator().manual_seed(100 + case.seed)
    channels = case.sample_shape[0]
    bn = case.bn(channels, momentum=case.momentum, affine=case.affine)
    with torch.no_grad():
        if case.affine:
            bn.weight.copy_(0.5 + torch.rand(channels, generator=generator))
            bn.bias.copy_(torch.randn(channels, generator=generator))
        bn.running_mean.copy_(torch.randn(channels, generator=generator))
        bn.running_var.copy_(0.5 + torch.rand(channels, generator=generator))
    return bn


def make_batches(case: Case) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``FORWARDS`` global batches (inputs, per-element loss weights). Channel offsets of 3 with
    scale 2 make the mean matter; the loss weights make every output element's gradient differ."""
    generator = torch.Generator().manual_seed(200 + case.seed)
    total = sum(case.sizes)
    channels = case.sample_shape[0]
    offset = 3 * torch.randn(channels, generator=generator).view(1, channels, *([1] * (len(case.sample_shape) - 1)))
    batches = []
    for _ in range(FORWARDS):
        x = 2 * torch.randn(total, *case.sample_shape, generator=generator) + offset
        batches.append((x, torch.randn(total, *case.sample_shape, generator=generator)))
    return batches


def objective(y: torch.Tensor, weights: torch.Tensor, total: int, world: int) -> torch.Tensor:
    """The trainer's scaled loss: local mean x n_local x world / total (per-sample loss = sum(y * w))."""
    per_sample = (y * weights).flatten(1).sum(1)
    return per_sample.mean() * (len(y) * world / total)


def run_case(case: Case, bn: nn.Module, rank: int, world: int) -> dict:
    """Train-mode forwards/backwards, then one eval forward, on this rank's slice of each batch."""
    start = sum(case.sizes[:rank])
    end = start + case.sizes[rank] if world > 1 else sum(case.sizes)
    total = sum(case.sizes)
    record: dict = {"y": [], "x_grad": [], "weight_grad": [], "bias_grad": [], "running_mean": [], "running_var": []}
    bn.train()
    for x, weights in make_batches(case):
        x = x[start:end].clone().requires_grad_(True)
        y = bn(x)
        objective(y, weights[start:end], total, world).backward()
        record["y"].append(y.detach())
        record["x_grad"].append(x.grad)
        if case.affine:
            record["weight_grad"].append(bn.weight.grad.clone())
            record["bias_grad"].append(bn.bias.grad.clone())
            bn.weight.grad = bn.bias.grad = None
        record["running_mean"].append(bn.running_mean.clone())
        record["running_var"].append(bn.running_var.clone())
    record["num_batches_tracked"] = int(bn.num_batches_tracked)
    bn.eval()
    with torch.no_grad():
        record["eval_y"] = bn(make_batches(case)[0][0][start:end])
    return record


class SmallConvNet(nn.Sequential):
    def __init__(self):
        torch.manual_seed(0)
        super().__init__(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1, stride=2), nn.BatchNorm2d(8, momentum=None), nn.ReLU(),
            nn.Flatten(), nn.Linear(8 * 4 * 4, 4),
        )


def train_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(42)
    return [
        (torch.randn(32, 3, 8, 8, generator=generator) + 1.0, torch.randint(0, 4, (32,), generator=generator))
        for _ in range(TRAIN_STEPS)
    ]


def train(model: nn.Module, rank: int, world: int) -> dict:
    """``TRAIN_STEPS`` SGD steps; each rank takes its 16 of the 32 samples and its local mean loss."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    per_rank = 32 // world
    losses = []
    for x, labels in train_batches():
        rows = slice(rank * per_rank, (rank + 1) * per_rank)
        loss = F.cross_entropy(model(x[rows]), labels[rows])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    module = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    return {"losses": torch.stack(losses), "state": {k: v.clone() for k, v in module.state_dict().items()}}


# ----- the workers ---------------------------------------------------------------------------------
def worker(path: str) -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=TIMEOUT)
    try:
        results: dict = {"cases": {}}
        for name, case in CASES.items():
            bn = make_bn(case)
            if case.convert:
                bn = convert_sync_batchnorm(bn)
                assert isinstance(bn, SyncBatchNorm) and isinstance(bn, case.bn)
            results["cases"][name] = run_case(case, bn, rank, world)
        for name, convert in (("train", True), ("train_unconverted", False)):
            model = SmallConvNet()
            if convert:
                model = convert_sync_batchnorm(model)
            results[name] = train(nn.parallel.DistributedDataParallel(model), rank, world)
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(results, gathered, dst=0)
        if rank == 0:
            # A file, not spawn's return value: that goes through a pipe the launcher reads only
            # after every worker exited, so a result larger than the pipe's buffer would block.
            torch.save(gathered, path)
    finally:
        dist.barrier()
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """Every rank's results of all cases (one spawn of 2 workers for the whole file)."""
    path = str(tmp_path_factory.mktemp("sync_batchnorm") / "ranks.pt")
    spawn(worker, (path,), nprocs=WORLD, timeout=TIMEOUT)
    results = torch.load(path)
    assert len(results) == WORLD
    return results


def reference(case: Case) -> dict:
    return run_case(case, make_bn(case), rank=0, world=1)


def close(actual, expected, rtol=RTOL, atol=ATOL) -> None:
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


def max_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


# ----- the tests -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case.convert])
def test_matches_one_batch_norm_over_the_concatenated_batch(ranks, name):
    case, single = CASES[name], reference(CASES[name])
    for i in range(FORWARDS):
        # Forward: the ranks' outputs, concatenated, are the single batch norm's output.
        close(torch.cat([r["cases"][name]["y"][i] for r in ranks]), single["y"][i])
        # Input gradients: W x the single-process ones (the ranks' objectives sum to W x the mean loss).
        close(torch.cat([r["cases"][name]["x_grad"][i] for r in ranks]), WORLD * single["x_grad"][i])
        if case.affine:
            # Weight/bias gradients are local; their sum over ranks is W x single, so DDP's average is single.
            for key in ("weight_grad", "bias_grad"):
                close(sum(r["cases"][name][key][i] for r in ranks) / WORLD, single[key][i])
        # Running statistics: identical on every rank and equal to the single process's.
        for r in ranks:
            close(r["cases"][name]["running_mean"][i], single["running_mean"][i])
            close(r["cases"][name]["running_var"][i], single["running_var"][i])
    for r in ranks:
        assert r["cases"][name]["num_batches_tracked"] == single["num_batches_tracked"] == FORWARDS
    # Eval mode: plain batch norm with the (synchronised) running statistics.
    close(torch.cat([r["cases"][name]["eval_y"] for r in ranks]), single["eval_y"])


def test_negative_control_plain_batch_norm_per_rank_differs(ranks):
    """Without conversion each rank normalises by its own 16 samples: the comparison above would
    fail, by far more than its tolerance (so it can fail)."""
    single = reference(CASES["2d_unconverted"])
    per_rank = [r["cases"]["2d_unconverted"] for r in ranks]
    margin = 100 * ATOL
    assert max_difference(torch.cat([r["y"][0] for r in per_rank]), single["y"][0]) > margin
    assert max_difference(torch.cat([r["x_grad"][0] for r in per_rank]), WORLD * single["x_grad"][0]) > margin
    for r in per_rank:
        assert max_difference(r["running_mean"][-1], single["running_mean"][-1]) > margin
        assert max_difference(r["running_var"][-1], single["running_var"][-1]) > margin
    # ... and the two ranks' running statistics disagree with each other.
    assert max_difference(per_rank[0]["running_mean"][-1], per_rank[1]["running_mean"][-1]) > margin


def test_ddp_training_with_sync_batch_norm_matches_one_process(ranks):
    """15 SGD steps of a conv net under DDP (local mean over 16, gradients averaged) == one process
    with the mean over 32: losses, parameters and running statistics."""
    single = train(SmallConvNet(), rank=0, world=1)
    # The global batch's mean loss is the mean of the ranks' local means (equal local batches).
    close(sum(r["train"]["losses"] for r in ranks) / WORLD, single["losses"], TRAIN_RTOL, TRAIN_ATOL)
    for r in ranks:
        assert r["train"]["state"].keys() == single["state"].keys()
        for key, value in single["state"].items():
            close(r["train"]["state"][key], value, TRAIN_RTOL, TRAIN_ATOL)


def test_ddp_training_without_conversion_diverges(ranks):
    """Negative control of the test above: the same DDP run with plain BatchNorm does not match."""
    single = train(SmallConvNet(), rank=0, world=1)
    losses = sum(r["train_unconverted"]["losses"] for r in ranks) / WORLD
    assert max_difference(losses, single["losses"]) > 100 * TRAIN_ATOL
    state = ranks[0]["train_unconverted"]["state"]
    assert max_difference(state["1.running_mean"], single["state"]["1.running_mean"]) > 100 * TRAIN_ATOL


# ----- single-process behaviour --------------------------------------------------------------------
def test_conversion_keeps_parameters_buffers_and_settings():
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, eps=1e-3, momentum=0.3),
        nn.Sequential(nn.Flatten(), nn.BatchNorm1d(4 * 36, affine=False, momentum=None)),
        nn.BatchNorm3d(2, track_running_stats=False),
    )
    model[1].eval()
    originals = [model[1], model[2][1], model[3]]
    tensors = [(m.weight, m.bias, m.running_mean, m.running_var, m.num_batches_tracked) for m in originals]
    converted = convert_sync_batchnorm(model, process_group=None)
    assert converted is model
    replacements = [model[1], model[2][1], model[3]]
    for old, new, kept in zip(originals, replacements, tensors):
        # Still an instance of the replaced class, so isinstance checks in user code keep working.
        assert isinstance(new, SyncBatchNorm) and isinstance(new, type(old))
        assert (new.weight, new.bias, new.running_mean, new.running_var, new.num_batches_tracked) == kept
        for attribute in ("num_features", "eps", "momentum", "affine", "track_running_stats", "training"):
            assert getattr(new, attribute) == getattr(old, attribute)
    assert isinstance(model[0], nn.Conv2d) and isinstance(model[2][0], nn.Flatten)
    assert list(dict(model.named_children())) == ["0", "1", "2", "3"]
    # Converting again changes nothing; a batch norm at the root is returned converted.
    assert convert_sync_batchnorm(model)[1] is replacements[0]
    assert type(convert_sync_batchnorm(nn.BatchNorm1d(3))) is SyncBatchNorm1d


@pytest.mark.parametrize("training", [True, False])
def test_without_a_process_group_it_is_plain_batch_norm(training):
    """Alone (no process group) and in eval mode: bit-identical to BatchNorm, state dict included."""
    case = Case(nn.BatchNorm2d, (4, 5, 5), (8,), momentum=None)
    plain, synced = make_bn(case), convert_sync_batchnorm(make_bn(case))
    plain.train(training)
    synced.train(training)
    x = make_batches(case)[0][0]
    assert torch.equal(plain(x), synced(x))
    assert plain.state_dict().keys() == synced.state_dict().keys()
    for key, value in plain.state_dict().items():
        assert torch.equal(value, synced.state_dict()[key])


def test_synced_forward_reads_nothing_back_with_two_or_more_samples(monkeypatch):
    """The synced path as on 2 ranks (the all-reduce stubbed: this rank's sums stand for all):
    momentum=None and 2+ samples make no host read (a sync per layer on a GPU) and match BatchNorm;
    1 sample in all reads the count and is refused."""
    from tests.support.helpers import HostSyncCounter
    from trainer.strategies import sync_batchnorm

    monkeypatch.setattr(sync_batchnorm, "_group_size", lambda group: 2)
    monkeypatch.setattr(sync_batchnorm.dist, "all_reduce", lambda tensor, group=None: None)
    case = Case(nn.BatchNorm2d, (4, 5, 5), (8,), momentum=None)
    plain, synced = make_bn(case), convert_sync_batchnorm(make_bn(case))
    x = make_batches(case)[0][0]
    with HostSyncCounter() as syncs:
        out = synced(x)
        out.sum().backward()
    assert syncs.count == 0, syncs.where
    torch.testing.assert_close(out, plain(x), rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(synced.running_var, plain.running_var, rtol=RTOL, atol=ATOL)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training, got 1"):
        synced(x[:1, :, :1, :1])  # one value per channel


@pytest.mark.gpu
def test_cuda_batch_norms_become_pytorchs_sync_batch_norm():
    """On CUDA the conversion hands over to PyTorch's fused nn.SyncBatchNorm (NCCL), keeping the tensors."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, momentum=0.2)).cuda()
    weight, running_var = model[1].weight, model[1].running_var
    convert_sync_batchnorm(model)
    assert type(model[1]) is nn.SyncBatchNorm
    assert model[1].weight is weight and model[1].running_var is running_var and model[1].momentum == 0.2


def test_input_dimensions_are_checked():
    with pytest.raises(ValueError, match="2 or more dimensions"):
        SyncBatchNorm(3)(torch.randn(3))
    # A converted BatchNorm2d refuses what BatchNorm2d refuses.
    with pytest.raises(ValueError, match="expected 4D input"):
        convert_sync_batchnorm(nn.BatchNorm2d(3))(torch.randn(2, 3, 5))


# ----- through the Trainer -------------------------------------------------------------------------
class SavingDigitsCNN(DigitsCNN):
    """The cnn recipe for 30 steps; saves its final state to ``<run_dir>/state.pt`` on rank 0."""

    def __init__(self):
        super().__init__(optimizer=partial(torch.optim.SGD, lr=0.1, momentum=0.9))

    def on_fit_end(self):
        if not dist.is_initialized() or dist.get_rank() == 0:
            torch.save(self.state_dict(), os.path.join(self.trainer.run_dir, "state.pt"))


def fit_digits(run_dir, devices: int, sync_batchnorm: bool = True) -> tuple[list[float], dict]:
    Trainer(
        strategy="ddp" if devices > 1 else "single", devices=devices, batch_size=64 // devices, max_steps=30,
        log_every_n_steps=1, loggers=["jsonl"], progress_bar=False, collective_timeout_s=60, run_dir=str(run_dir),
        sync_batchnorm=sync_batchnorm,
    ).fit(SavingDigitsCNN())
    return train_losses(str(run_dir)), torch.load(os.path.join(str(run_dir), "state.pt"))


def test_trainer_ddp_with_sync_batch_norm_matches_one_process(tmp_path):
    """trainer.sync_batchnorm=true: 2 ranks x 32 under the Trainer's DDP (its loss scaling, DDP's
    averaging) == 1 process x 64."""
    single_losses, single_state = fit_digits(tmp_path / "single", devices=1)
    ddp_losses, ddp_state = fit_digits(tmp_path / "ddp", devices=2)
    close(torch.tensor(ddp_losses), torch.tensor(single_losses), TRAIN_RTOL, TRAIN_ATOL)
    for key, value in single_state.items():
        close(ddp_state[key], value, TRAIN_RTOL, TRAIN_ATOL)
