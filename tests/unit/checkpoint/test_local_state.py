"""A one-process checkpoint's full state built without torch.distributed.checkpoint equals what
torch's helpers give, and falls back to them where it cannot know the answer."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

from trainer.checkpoint.local_state import plain_full_state
from trainer.checkpoint.state import get_training_state


def _trained(module: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor) -> None:
    for _ in range(2):
        module(inputs).float().pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _torch_full_state(module, optimizer):
    options = StateDictOptions(full_state_dict=True, cpu_offload=False)
    if optimizer is None:
        return {"model": get_model_state_dict(module, options=options)}
    model, optim = get_state_dict(module, optimizer, options=options)
    return {"model": model, "optim": optim}


def _assert_same(ours, theirs):
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs)
        for key in theirs:
            _assert_same(ours[key], theirs[key])
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            _assert_same(a, b)
    elif isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor) and ours.dtype == theirs.dtype and torch.equal(ours, theirs)
    else:
        assert ours == theirs


def _batchnorm_net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))


def test_groups_frozen_parameters_and_buffers_as_torch_gives_them():
    module = _batchnorm_net()
    module[0].weight.requires_grad_(False)
    optimizer = torch.optim.AdamW([{"params": [module[3].weight, module[0].bias], "lr": 1e-3},
                                   {"params": [module[3].bias, module[1].weight, module[1].bias], "lr": 2e-3}])
    _trained(module, optimizer, torch.randn(5, 3))
    ours = plain_full_state(module, optimizer)
    assert ours is not None
    _assert_same(ours, _torch_full_state(module, optimizer))
    assert ours["optim"]["param_groups"][0]["params"] == ["3.weight", "0.bias"]


def test_momentum_sgd_and_no_optimizer():
    module = _batchnorm_net()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    _trained(module, optimizer, torch.randn(5, 3))
    _assert_same(get_training_state(module, optimizer, full=True), _torch_full_state(module, optimizer))
    _assert_same(get_training_state(module, None, full=True), _torch_full_state(module, None))


def test_falls_back_where_torch_knows_more():
    # Tied weights: one parameter under two names.
    tied = nn.Sequential(nn.Embedding(5, 4), nn.Linear(4, 5, bias=False))
    tied[1].weight = tied[0].weight
    optimizer = torch.optim.Adam(tied.parameters())
    _trained(tied, optimizer, torch.tensor([[1, 2]]))
    assert plain_full_state(tied, optimizer) is None
    _assert_same(get_training_state(tied, optimizer, full=True), _torch_full_state(tied, optimizer))

    # Several optimizers (manual optimization) go to torch's helpers, which take a list.
    module = _batchnorm_net()
    optimizers = [torch.optim.Adam(module[0].parameters()), torch.optim.SGD(module[3].parameters(), lr=0.1)]
    module(torch.randn(5, 3)).sum().backward()
    for optimizer in optimizers:
        optimizer.step()
    assert plain_full_state(module, optimizers) is None
    _assert_same(get_training_state(module, optimizers, full=True), _torch_full_state(module, optimizers))

    # No optimizer state yet (torch's helpers make it), and a compiled module's prefixed names.
    module = _batchnorm_net()
    assert plain_full_state(module, torch.optim.Adam(module.parameters())) is None
    wrapped = nn.Module()
    wrapped._orig_mod = _batchnorm_net()
    assert plain_full_state(wrapped, None) is None
