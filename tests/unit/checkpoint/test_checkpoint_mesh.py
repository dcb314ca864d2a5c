"""A checkpoint records the device mesh (strategy=nd's layout); each rank's random generators are restored
only on a run of the same layout, not merely the same number of ranks: on another mesh a rank would
take the generators of a rank that held another part of the model and read other samples."""

import logging
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from trainer.checkpoint import CheckpointConfig, CheckpointManager, RunStates, layout
from trainer.checkpoint.state import describe_layout
from trainer.runtime.seeding import derive_seed

STEP = 3
TWO_BY_TWO = {"pp": 1, "dp_replicate": 1, "dp_shard": 2, "cp": 1, "tp": 2}
FOUR_BY_ONE = {"pp": 1, "dp_replicate": 1, "dp_shard": 4, "cp": 1, "tp": 1}


class OnMesh(nn.Linear):
    """A module whose ``device_mesh`` has the given dimensions (what strategy=nd's TrainModule shows)."""

    def __init__(self, dims):
        super().__init__(4, 2)
        self.device_mesh = None if dims is None else SimpleNamespace(
            mesh_dim_names=tuple(dims), shape=tuple(dims.values()), ndim=len(dims))


def _states(dims):
    model = OnMesh(dims)
    return RunStates(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                     progress=lambda: {"step": STEP, "epoch": 0, "epoch_step": STEP})


@pytest.fixture
def saved(tmp_path):
    """A checkpoint saved on the 2 x 2 mesh, and what the generator drew right after the save."""
    torch.manual_seed(5)
    manager = CheckpointManager(CheckpointConfig(dir=str(tmp_path), save_on_signal=False), str(tmp_path))
    manager.setup()
    manager.save(_states(TWO_BY_TWO))
    manager.close(clean=True)
    return layout.find_latest(str(tmp_path)), torch.rand(3)


def _load(path, dims, caplog):
    torch.manual_seed(99)  # something else, so a restore shows
    with caplog.at_level(logging.INFO, logger="trainer.checkpoint"):
        CheckpointManager(CheckpointConfig(save_on_signal=False), str(path)).load(path, _states(dims))
    return torch.rand(3), [r.getMessage() for r in caplog.records if "re-seeded" in r.getMessage()]


def test_the_marker_records_the_mesh(saved):
    assert layout.read_marker(saved[0])["mesh"] == TWO_BY_TWO


def test_same_mesh_restores_the_generators(saved, caplog):
    path, after_save = saved
    drawn, lines = _load(path, TWO_BY_TWO, caplog)
    assert torch.equal(drawn, after_save) and not lines


@pytest.mark.parametrize("dims", [FOUR_BY_ONE, None], ids=["another mesh", "no mesh"])
def test_another_layout_of_the_same_world_size_reseeds_and_says_so(saved, caplog, dims):
    path, after_save = saved
    drawn, lines = _load(path, dims, caplog)
    torch.manual_seed(derive_seed(0, "resume", STEP, 0))  # the log's claim
    assert torch.equal(drawn, torch.rand(3)) and not torch.equal(drawn, after_save)
    assert lines == [f"resuming a checkpoint of 1 rank (dp_shard 2 x tp 2) on {describe_layout(1, dims)}: random "
                     f"generators re-seeded from (seed 0, step {STEP}, rank), not restored"]


def test_describe_layout():
    assert describe_layout(4, TWO_BY_TWO) == "4 ranks (dp_shard 2 x tp 2)"
    assert describe_layout(1, None) == "1 rank"


# ----- a sharded stream's position follows the data-parallel rank, not the rank's number -------------------
def _stream_plan(data_rank, world=2):
    """What the checkpoint reads of a data.stream_mode=sharded plan (trainer/data/streaming/plan.py)."""
    return SimpleNamespace(is_stream=True, mode="sharded", world=world, num_workers=0, rank=data_rank, resume=None,
                           checkpoint_state=lambda epoch, step: {"mode": "sharded", "world": world, "num_workers": 0,
                                                                 "epoch": epoch, "epoch_step": step,
                                                                 "loader": f"shards of data rank {data_rank}"})


@pytest.mark.parametrize("saved_on, resumed_on", [((0, 0, 1, 1), (0, 1)), ((0, 1), (0, 0, 1, 1)),
                                                  ((0, 0, 1, 1), (0, 1, 0, 1))],
                         ids=["dp 2 x tp 2 -> dp 2", "dp 2 -> dp 2 x tp 2", "another order of the dimensions"])
def test_sharded_stream_position_follows_the_data_parallel_rank(tmp_path, monkeypatch, saved_on, resumed_on):
    from trainer.checkpoint import stream_position

    # Each global rank (its number: the index) saves as the data-parallel rank it had.
    for rank, data_rank in enumerate(saved_on):
        monkeypatch.setattr(stream_position.distributed, "rank", lambda rank=rank: rank)
        stream_position.save_stream_state(_stream_plan(data_rank), 0, STEP, str(tmp_path))
    for rank, data_rank in enumerate(resumed_on):
        monkeypatch.setattr(stream_position.distributed, "rank", lambda rank=rank: rank)
        plan = _stream_plan(data_rank)
        stream_position.restore_stream_state(plan, str(tmp_path), 0, STEP)
        assert plan.resume == (0, STEP, f"shards of data rank {data_rank}"), rank


def test_reseed_follows_the_strategys_random_stream(saved, caplog):
    # Re-seeded on another layout: from the strategy's random_stream_rank (strategy=nd: its
    # tensor-parallel group's first rank), so the ranks of one group draw alike after the resume too.
    from trainer.strategies.base import Strategy

    class SharedStream(Strategy):
        random_stream_rank = 2  # (this process is rank 0)

    path, _ = saved
    torch.manual_seed(99)
    CheckpointManager(CheckpointConfig(save_on_signal=False), str(path), SharedStream()).load(path, _states(FOUR_BY_ONE))
    drawn = torch.rand(3)
    torch.manual_seed(derive_seed(0, "resume", STEP, 2))
    assert torch.equal(drawn, torch.rand(3))
