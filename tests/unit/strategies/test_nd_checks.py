"""strategy=nd refuses, in the calling process before any worker starts and in one line: degrees
that do not fit the world, a tensor-parallel degree the model cannot take, a plan naming a missing
submodule (found on a meta-device build of the model; the user's module is not touched)."""

from __future__ import annotations

import pytest
from torch import nn

from tests.support.helpers import new_trainer
from tests.support.nd_modules import TokenClassifier
from trainer.strategies.nd import NDStrategy
from trainer.strategies.nd_probe import check_plan_before_launch


def _one_line(error):
    assert "\n" not in str(error.value), str(error.value)


def test_degrees_that_do_not_divide_the_world(tmp_path):
    with pytest.raises(ValueError, match=r"\(dp_shard -1 x tp 3\) do not divide the world size 4.*\[1, 2, 4\]") as error:
        new_trainer(tmp_path, strategy=NDStrategy(tp=3), devices=4)
    _one_line(error)


def test_plan_naming_a_missing_submodule(tmp_path):
    trainer = new_trainer(tmp_path, strategy=NDStrategy(tp=2), devices=2)
    module = TokenClassifier(plan="missing")
    with pytest.raises(ValueError, match=r"names 'blocks.\*.dwn', which is no submodule .*did you mean") as error:
        trainer.fit(module)
    _one_line(error)
    assert not hasattr(module, "blocks")  # the probe built its own copy


def test_tensor_parallel_degree_the_model_cannot_take(tmp_path):
    trainer = new_trainer(tmp_path, strategy=NDStrategy(tp=4), devices=4)
    with pytest.raises(ValueError, match=r"strategy.tp=4 does not divide the model's features 6") as error:
        trainer.fit(TokenClassifier())
    _one_line(error)


def test_a_plan_is_checked_on_layers_built_in_init():
    class Eager(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(1000, 1000)

        def tensor_parallel_plan(self):
            from torch.distributed.tensor.parallel import ColwiseParallel

            return {"layers": ColwiseParallel()}

    module = Eager()
    with pytest.raises(ValueError, match=r"names 'layers'.*did you mean layer\?"):
        check_plan_before_launch(module)
    assert not module.layer.weight.is_meta


def test_a_good_plan_passes():
    check_plan_before_launch(TokenClassifier())
    check_plan_before_launch(TokenClassifier(plan="none"))


def test_sync_batchnorm_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"trainer.sync_batchnorm=true is not supported with strategy=nd: ") as error:
        new_trainer(tmp_path, strategy=NDStrategy(tp=2), devices=2, sync_batchnorm=True)
    _one_line(error)


def test_no_plan_and_no_configure_model_to_split_it(tmp_path):
    from tests.support.helpers import Regressor

    trainer = new_trainer(tmp_path, strategy=NDStrategy(tp=2), devices=2)
    with pytest.raises(ValueError, match=r"strategy.tp=2 but Regressor declares no tensor_parallel_plan\(\)") as error:
        trainer.fit(Regressor())
    _one_line(error)
