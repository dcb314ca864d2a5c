"""Seams between parallelism and the rest of the trainer: pipeline
randomness, sync batch norm under pipeline and with padding micro-batches, the node-local rank
under SLURM, ``init_from`` into pipeline stages, the collective recorder under every strategy and
pipeline's token weighting.

Tolerances: CPU fp32, rtol=1e-5 / atol=1e-6 (sums reordered across ranks and microbatches).
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

import pytest
import torch

from tests.support.helpers import BlockRegressor, NoisyInputs, fit
from trainer.strategies.pipeline import PipelineStrategy

pytestmark = pytest.mark.timeout(300)
TOL = dict(rtol=1e-5, atol=1e-6)


def assert_same(a, b):
    (losses_a, params_a), (losses_b, params_b) = a, b
    assert len(losses_a) == len(losses_b) > 0
    torch.testing.assert_close(torch.tensor(losses_a), torch.tensor(losses_b), **TOL)
    assert params_a.keys() == params_b.keys()
    for name in params_a:
        torch.testing.assert_close(params_a[name], params_b[name], **TOL, msg=f"parameter {name} differs")


# ----- 11: the node-local rank under plain srun ---------------------------------------------------------------
def test_rank_zero_first_local_uses_the_cluster_environment_under_slurm(monkeypatch):
    # Plain srun sets SLURM_LOCALID, not LOCAL_RANK: the first task on the second node (global
    # rank 2 of 2 nodes x 2 tasks) is that node's local rank 0 and must prepare its data first.
    from trainer.runtime import distributed
    from trainer.runtime.launch import detect_environment

    env = detect_environment({"SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NTASKS": "4", "SLURM_NNODES": "2",
                              "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_ID": "7"})
    assert env.launcher == "slurm" and env.local_rank == 0 and env.rank == 2
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: None)
    monkeypatch.setattr(torch.distributed, "new_group", lambda *a, **k: None)
    # (no heartbeat: there is no job store here, and a watch that sees none ends its process)
    monkeypatch.setattr(distributed, "_start_heartbeat", lambda *a, **k: None)
    distributed.init_process_group(env, "gloo", timedelta(seconds=5))  # records the environment
    monkeypatch.setattr(distributed, "is_distributed", lambda: True)
    monkeypatch.setattr(distributed, "rank", lambda: 2)
    barriers = []
    monkeypatch.setattr(distributed, "barrier", lambda: barriers.append(1))
    try:
        with distributed.rank_zero_first(local=True) as first:
            assert first and not barriers  # went first, nobody waited for
        assert barriers == [1]  # then released the node's other tasks
        with distributed.rank_zero_first(local=False) as first:
            assert not first  # job-wide, rank 2 waits for rank 0
    finally:
        distributed._environment = None
        distributed._control_group = None


# ----- 14 (pipeline part): token weighting in fp64, not the loss dtype -------------------------------------------
def test_pipeline_token_weight_is_exact_for_a_bf16_loss():
    # bf16 holds integers exactly only up to 256: 257 tokens x a bf16 loss of 1 must weigh 257.
    class Loss:
        def pipeline_loss(self, output, batch):
            return {"loss": torch.ones((), dtype=torch.bfloat16), "num_tokens": torch.tensor(257.0)}

    strategy = PipelineStrategy()
    strategy._module, strategy._batch, strategy._real, strategy._records = Loss(), torch.zeros(4, 1), 4, {}
    strategy._scale, strategy._by_tokens, strategy._scale_loss = 1.0, True, lambda loss: loss
    weighted = strategy._loss_fn(torch.zeros(4, 1), torch.arange(4))
    assert weighted.dtype in (torch.float32, torch.float64) and weighted.item() == 257.0


# ----- 12: trainer.init_from into pipeline stages ----------------------------------------------------------------
def test_pipeline_init_from_loads_each_stage_from_the_full_file(tmp_path):
    # Weights that are not the build's own: each stage takes its names from the full file and
    # then trains exactly as one process initialised from the same file.
    torch.manual_seed(123)
    source = BlockRegressor(depth=4)
    source.configure_model()
    full = {k: v.detach().clone() for k, v in source.state_dict().items()}
    torch.save(full, tmp_path / "init.pt")
    args = dict(batch_size=8, max_steps=3, init_from=str(tmp_path / "init.pt"))
    single = fit(tmp_path / "single", BlockRegressor(depth=4), **args)
    piped = fit(tmp_path / "pp", BlockRegressor(depth=4), strategy=PipelineStrategy(microbatches=2), devices=2, **args)
    assert_same(piped, single)
    untrained = fit(tmp_path / "zero", BlockRegressor(depth=4), batch_size=8, max_steps=1)
    assert not torch.allclose(untrained[1]["out.weight"], single[1]["out.weight"])  # the file mattered
    # Strict about each stage's own names: one missing from the file is an error naming it.
    del full["out.weight"]  # on the last stage (rank 1)
    torch.save(full, tmp_path / "partial.pt")
    with pytest.raises(Exception, match=r"missing keys: out.weight \(on rank 1\)"):
        fit(tmp_path / "bad", BlockRegressor(depth=4), strategy=PipelineStrategy(microbatches=2), devices=2,
            batch_size=8, max_steps=1, init_from=str(tmp_path / "partial.pt"))


# ----- 9: sync batch norm under pipeline is refused before any worker starts ---------------------------------------
def test_pipeline_sync_batchnorm_is_refused_before_the_workers_start(tmp_path, monkeypatch):
    from trainer import Trainer
    from trainer.runtime import launch

    monkeypatch.setattr(launch, "spawn", lambda *a, **k: pytest.fail("a worker was started"))
    with pytest.raises(ValueError, match=r"trainer.sync_batchnorm=true is not supported with strategy=pipeline: .*"
                                         r"set trainer.sync_batchnorm=false .* strategy=ddp or strategy=fsdp"):
        Trainer(strategy=PipelineStrategy(), devices=2, sync_batchnorm=True, run_dir=str(tmp_path))
    Trainer(strategy=PipelineStrategy(), devices=2, sync_batchnorm=False, run_dir=str(tmp_path))  # the alternative
    Trainer(strategy="ddp", devices=2, sync_batchnorm=True, run_dir=str(tmp_path))


# ----- 10: padding micro-batches add nothing to synchronised batch-norm statistics -----------------------------------
class NormedRegressor(BlockRegressor):
    """Linear -> BatchNorm1d over (N, 3, 4) -> Linear: one sample still gives 4 values per channel.
    Saves the full state (running statistics included) to ``params.pt``."""

    def configure_model(self):
        self.inp = torch.nn.Linear(6, 12)
        self.norm = torch.nn.BatchNorm1d(3)
        self.out = torch.nn.Linear(12, 1)

    def forward(self, x):
        return self.out(self.norm(self.inp(x).view(-1, 3, 4)).flatten(1))


def test_sync_batchnorm_ignores_padding_micro_batches(tmp_path):
    # 19 samples, global batch 8 (1 x accumulate 4 x 2 ranks): the short last window of 3 samples
    # leaves rank 1's second micro-step empty, so it runs a padding micro-batch. One process: the
    # same micro-steps of 2 samples (and then 1); the padding sample must not enter the statistics.
    args = dict(num_samples=19, lr=0.05)
    steps = dict(max_steps=3, accumulate_grad_batches=4, sync_batchnorm=True)
    single = fit(tmp_path / "one", NormedRegressor(**args), batch_size=2, **steps)
    ddp = fit(tmp_path / "ddp", NormedRegressor(**args), strategy="ddp", devices=2, batch_size=1, **steps)
    assert len(single[0]) == 3 and "norm.running_var" in single[1]
    assert_same(ddp, single)  # losses, parameters and running statistics after the short window


# ----- 8: random augmentation under pipeline -------------------------------------------------------------------------
class NoisyPairs(NoisyInputs):
    """Random noise drawn from torch's global generator on inputs *and* targets while loading:
    the first stage uses the inputs, the last the targets, so they must come from one draw."""

    def __getitem__(self, index):
        x, y = self.data[index]
        return x + 0.1 * torch.randn_like(x), y + 0.1 * torch.randn_like(y)


class NoisyBlocks(BlockRegressor):
    def train_dataset(self):
        return NoisyPairs(super().train_dataset())


@pytest.mark.parametrize("workers", [0, 2])
def test_pipeline_random_augmentation_equals_one_process(tmp_path, workers):
    # Loader seeds keyed by the data-parallel rank: both stages of the pipeline draw the same
    # noise for a sample, the one a single process draws (with or without workers: one draw).
    args = dict(batch_size=8, max_steps=4, num_workers=workers)
    single = fit(tmp_path / "one", NoisyBlocks(depth=2, num_samples=64), **args)
    if workers:
        assert_same(fit(tmp_path / "one0", NoisyBlocks(depth=2, num_samples=64), **{**args, "num_workers": 0}), single)
    piped = fit(tmp_path / "pp", NoisyBlocks(depth=2, num_samples=64), strategy=PipelineStrategy(microbatches=2),
                devices=2, **args)
    assert_same(piped, single)


def test_loading_without_workers_leaves_the_training_stream_alone():
    # Main-process loading draws from per-batch seeds and puts the generators back: the stream
    # dropout draws from is the same whether or not (and however much) the loader drew.
    from trainer.data.loaders import LoaderOptions, build_loader

    data = NoisyPairs(torch.utils.data.TensorDataset(torch.zeros(8, 2), torch.zeros(8, 1)))
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    first = [b for b in build_loader(data, [[0, 1], [2, 3]], torch.utils.data.default_collate, LoaderOptions(), seed=11)]
    assert torch.equal(torch.rand(3), expected)
    again = [b for b in build_loader(data, [[2, 3]], torch.utils.data.default_collate, LoaderOptions(), seed=11, first_batch=1)]
    assert torch.equal(again[0][0], first[1][0])  # a batch's draw depends on its position only (resume)


def _cuda_padding_worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from trainer.strategies.sync_batchnorm import convert_sync_batchnorm, padding_micro_batch

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    torch.manual_seed(0)
    real, pad = torch.randn(4, 3, 5, 5, device="cuda"), torch.randn(1, 3, 5, 5, device="cuda")
    bn = convert_sync_batchnorm(torch.nn.BatchNorm2d(3).cuda())
    assert type(bn) is torch.nn.SyncBatchNorm
    x = (real if rank == 0 else pad).requires_grad_()
    with padding_micro_batch() if rank == 1 else contextlib.nullcontext():
        y = bn(x)
    (y * torch.arange(y.numel(), device="cuda").view_as(y)).sum().mul(rank == 0).backward()
    if rank == 0:
        torch.save({"y": y.detach().cpu(), "grad": x.grad.cpu(), "running_var": bn.running_var.cpu()}, out)
    dist.destroy_process_group()


@pytest.mark.gpu
def test_cuda_sync_batchnorm_ignores_padding_micro_batches(tmp_path):
    # PyTorch's nn.SyncBatchNorm (what CUDA batch norms become), 2 processes on one GPU over gloo:
    # rank 1's padding sample must not enter rank 0's statistics or gradients.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_cuda_padding_worker, args=(port, str(tmp_path / "out.pt")), nprocs=2)
    got = torch.load(tmp_path / "out.pt")
    torch.manual_seed(0)
    real = torch.randn(4, 3, 5, 5, device="cuda").requires_grad_()
    bn = torch.nn.BatchNorm2d(3).cuda()
    y = bn(real)
    (y * torch.arange(y.numel(), device="cuda").view_as(y)).sum().backward()
    torch.testing.assert_close(got["y"], y.detach().cpu(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got["grad"], real.grad.cpu(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got["running_var"], bn.running_var.cpu(), rtol=1e-5, atol=1e-6)


# ----- 13: the collective recorder tells gradient all-reduces from sync batch norm's -------------------------------
def test_comms_log_labels_sync_batchnorm_apart_from_gradients(tmp_path):
    import json

    from trainer.runtime.comms_log import GRADIENT_KIND, SYNC_BN_KIND

    fit(tmp_path, NormedRegressor(num_samples=32), strategy="ddp", devices=2, batch_size=4, max_steps=4,
        accumulate_grad_batches=2, sync_batchnorm=True, log_every_n_steps=100, profile={"comms_steps": [3, 3]})
    for rank in range(2):
        report = json.loads((tmp_path / "comms" / f"rank{rank}.json").read_text())
        # 2 micro-batches: a forward and a backward batch-norm all-reduce each; one gradient round;
        # DDP's broadcast of the buffers (running statistics) from rank 0 before each forward
        assert sorted(report["kinds"]) == [GRADIENT_KIND, SYNC_BN_KIND, "broadcast"]
        assert report["kinds"]["broadcast"]["count"] == 2
        assert report["kinds"][SYNC_BN_KIND]["count"] == 4 and report["gradient_rounds"] == 1
