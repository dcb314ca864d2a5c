"""Unit selection (wrap policies) and meta-device initialisation, in one process."""

import pytest
import torch
from torch import nn

from tests.support.helpers import BlockRegressor, ResidualBlock
from trainer.recipes.gpt import Block, GPTModule
from trainer.strategies.weight_init import WeightInit, has_meta_tensors
from trainer.strategies.wrap_policy import describe_units, select_units


def built(module):
    torch.manual_seed(0)
    module.configure_model()
    return module


def test_auto_uses_declared_block_classes():
    module = built(BlockRegressor(depth=3))
    units = select_units(module, "auto", module.block_classes())
    assert units == list(module.blocks)
    assert describe_units(module, units).startswith("3 x ResidualBlock")


def test_auto_without_declaration_takes_module_list_children():
    module = built(BlockRegressor(depth=2))
    assert select_units(module, "auto") == list(module.blocks)


def test_class_names_bare_or_qualified():
    module = built(BlockRegressor(depth=2))
    assert select_units(module, ["ResidualBlock"]) == list(module.blocks)
    assert select_units(module, ["tests.support.helpers.ResidualBlock", "LayerNorm"]) == [
        module.blocks[0].norm, module.blocks[0], module.blocks[1].norm, module.blocks[1]
    ]  # children before their parents


def test_unknown_class_name_is_a_clear_error():
    module = built(BlockRegressor(depth=2))
    with pytest.raises(ValueError, match=r"strategy.wrap: \['Blok'\] match no submodule of BlockRegressor; "
                                         r"classes with parameters in this model: .*ResidualBlock"):
        select_units(module, ["Blok"])


def test_min_num_params_wraps_large_modules_only():
    module = built(BlockRegressor(width=32, depth=2))
    per_block = sum(p.numel() for p in module.blocks[0].parameters())  # 32*32 + 32 + 2*32
    units = select_units(module, "none", min_num_params=per_block)
    assert units == list(module.blocks)  # the small input / output layers stay in the root
    assert select_units(module, "none", min_num_params=10**9) == []


def test_gpt_meta_build_equals_eager_build():
    # GPTModule owns initialisation (init_weights), so eager and meta builds are identical.
    eager = GPTModule(layers=2, width=32, heads=2, block_size=16)
    torch.manual_seed(5)
    eager.configure_model()
    WeightInit(eager, seed=5).eager()

    meta = GPTModule(layers=2, width=32, heads=2, block_size=16)
    torch.manual_seed(5)
    with torch.device("meta"):
        meta.configure_model()
    assert has_meta_tensors(meta)
    units = select_units(meta, "auto", meta.block_classes())
    assert [type(u) for u in units] == [Block, Block]
    sharded = []
    WeightInit(meta, seed=5).materialize(torch.device("cpu"), units, sharded.append)
    assert sharded == units and not has_meta_tensors(meta)
    for (name, a), (_, b) in zip(eager.state_dict().items(), meta.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_reset_parameters_replay_equals_eager_build():
    # BlockRegressor keeps torch.nn's default initialisation: meta replays reset_parameters().
    eager = built(BlockRegressor())
    meta = BlockRegressor()
    torch.manual_seed(0)
    with torch.device("meta"):
        meta.configure_model()
    order = []
    WeightInit(meta, seed=0).materialize(torch.device("cpu"), list(meta.blocks), order.append)
    assert order == list(meta.blocks)
    for (name, a), (_, b) in zip(eager.state_dict().items(), meta.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_meta_module_without_reset_parameters_is_a_clear_error():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.gain = nn.Parameter(torch.ones(3))

    class Model(BlockRegressor):
        def configure_model(self):
            super().configure_model()
            self.scale = Scale()

    module = Model()
    with torch.device("meta"):
        module.configure_model()
    with pytest.raises(ValueError, match=r"submodule 'scale' \(Scale\) has parameters or buffers of its own but no reset_parameters"):
        WeightInit(module, seed=0).materialize(torch.device("cpu"), [], lambda unit: None)


def test_block_classes_default_is_empty():
    assert BlockRegressor().block_classes() == (ResidualBlock,)
    from trainer import TrainModule

    assert TrainModule().block_classes() == ()
