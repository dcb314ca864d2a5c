"""ParallelDims: the degrees checked against the world size in one line, -1 filled in, each rank's
coordinates on the mesh and which samples it loads; NDStrategy's checks made before any worker starts."""

from __future__ import annotations

import pytest

from trainer.strategies.nd import NDStrategy
from trainer.strategies.parallel_dims import ParallelDims


def test_minus_one_is_the_rest_of_the_world():
    dims = ParallelDims.resolve(8, dp_shard=-1, tp=2)
    assert (dims.pp, dims.dp_replicate, dims.dp_shard, dims.cp, dims.tp) == (1, 1, 4, 1, 2)
    assert dims.dp == 4 and dims.world_size == 8 and dims.sizes() == (1, 1, 4, 1, 2)
    assert dims.describe() == "dp_shard 4 x tp 2 = 8 ranks"


def test_all_given_must_multiply_to_the_world():
    assert ParallelDims.resolve(8, dp_replicate=2, dp_shard=2, tp=2).dp == 4
    with pytest.raises(ValueError, match=r"multiply to 4, not to the world size 8") as error:
        ParallelDims.resolve(8, dp_shard=2, tp=2)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("degrees, text", [
    (dict(dp_shard=-1, tp=3), r"do not divide the world size 8.*\[1, 2, 4, 8\]"),
    (dict(dp_shard=-1, tp=-1), r"strategy.dp_shard and strategy.tp are both -1"),
    (dict(tp=0), r"strategy.tp=0 must be a positive integer, or -1"),
    (dict(tp=2.0), r"strategy.tp=2.0 must be a positive integer"),
    (dict(tp=True), r"strategy.tp=True must be a positive integer"),
    (dict(ep=2), r"strategy.ep is not a parallel degree"),
])
def test_bad_degrees_are_one_line(degrees, text):
    with pytest.raises(ValueError, match=text) as error:
        ParallelDims.resolve(8, **degrees)
    assert "\n" not in str(error.value)


def test_coordinates_are_row_major_tp_innermost():
    dims = ParallelDims.resolve(8, dp_replicate=2, dp_shard=2, tp=2)
    assert dims.coordinates(0) == dict(pp=0, dp_replicate=0, dp_shard=0, cp=0, tp=0)
    assert dims.coordinates(1) == dict(pp=0, dp_replicate=0, dp_shard=0, cp=0, tp=1)
    assert dims.coordinates(6) == dict(pp=0, dp_replicate=1, dp_shard=1, cp=0, tp=0)


def test_tp_group_first_rank():
    # The rank whose random stream a tensor-parallel group shares (strategy.random_stream_rank).
    dims = ParallelDims.resolve(8, dp_shard=2, tp=4)
    assert [dims.tp_group_first_rank(rank) for rank in range(8)] == [0, 0, 0, 0, 4, 4, 4, 4]
    assert [ParallelDims.resolve(4, dp_shard=4).tp_group_first_rank(rank) for rank in range(4)] == [0, 1, 2, 3]


def test_tensor_parallel_ranks_load_the_same_samples():
    dims = ParallelDims.resolve(8, dp_replicate=2, dp_shard=2, tp=2)
    assert [dims.data_parallel_rank(rank) for rank in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [ParallelDims.resolve(4, dp_shard=4).data_parallel_rank(rank) for rank in range(4)] == [0, 1, 2, 3]


def test_nd_strategy_sizes_and_refusals():
    strategy = NDStrategy(tp=2)
    strategy.check_world_size(8, 8)
    assert strategy.data_parallel_size(8) == 4 and strategy.dims.dp_shard == 4
    with pytest.raises(ValueError, match=r"do not divide the world size 6"):
        NDStrategy(tp=4).check_world_size(6, 6)
    piped = NDStrategy(pp=2, tp=2)  # the pipeline on the nd mesh (tests/multiprocess/strategies/test_pipeline_tp.py)
    piped.check_world_size(8, 8)
    assert piped.name == "nd" and piped.owns_step and piped.data_parallel_size(8) == 2
    with pytest.raises(ValueError, match=r"strategy.cp=2: context parallel needs CUDA"):
        NDStrategy(cp=2)
    with pytest.raises(ValueError, match=r"strategy.loss_parallel='yes'"):
        NDStrategy(loss_parallel="yes")
    with pytest.raises(ValueError, match=r"strategy.param_dtype='bf16' sets FSDP's mixed-precision policy"):
        NDStrategy(tp=2, param_dtype="bf16").check_world_size(2, 2)


def test_pipeline_tp_ranks_share_their_groups_random_stream(monkeypatch):
    # rank 7 of pp 2 x dp 2 x tp 2 is tp rank 1 of the group {6, 7}: it draws rank 6's stream.
    from trainer.runtime import distributed
    from trainer.strategies.pipeline import PipelineStrategy

    strategy = PipelineStrategy(stages=2, tp=2)
    monkeypatch.setattr(distributed, "rank", lambda: 7)
    strategy.tp_rank = 1
    assert strategy.random_stream_rank == 6
    strategy.tp_rank = 0
    assert strategy.random_stream_rank == 7
