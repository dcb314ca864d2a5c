"""``trainer.lightning.Fabric``: one process on one device in full precision. A loop written for
Fabric trains exactly as the same loop in plain torch; a LightningModule set up with it logs to its
loggers, clips and steps through it; what it does not do is refused with one line."""

from __future__ import annotations

from unittest.mock import Mock

import pytest
import torch

import trainer.lightning as L
from trainer.lightning.fabric import Fabric
from trainer.lightning.utilities import GradClipAlgorithmType


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.inner = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))

    def forward(self, x):
        return self.inner(x)


def _data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, generator=generator)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def _train(use_fabric: bool, clip: str) -> tuple[list[float], dict]:
    torch.manual_seed(1)
    module = Net()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    loader = _data()
    if use_fabric:
        fabric = Fabric(accelerator="cpu", devices=1)
        module, optimizer = fabric.setup(module, optimizer)
        loader = fabric.setup_dataloaders(loader)
    losses = []
    for _ in range(2):
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(module(x), y)
            if use_fabric:
                fabric.backward(loss)
                fabric.clip_gradients(module, optimizer, **({"clip_val": 0.05} if clip == "value" else {"max_norm": 0.1}))
            else:
                loss.backward()
                if clip == "value":
                    torch.nn.utils.clip_grad_value_(module.parameters(), 0.05)
                else:
                    torch.nn.utils.clip_grad_norm_(module.parameters(), 0.1)
            optimizer.step()
            losses.append(loss.item())
    return losses, {k: v.clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("clip", ["value", "norm"])
def test_a_fabric_loop_trains_exactly_as_the_plain_torch_loop(clip):
    fabric_losses, fabric_params = _train(True, clip)
    torch_losses, torch_params = _train(False, clip)
    assert fabric_losses == torch_losses  # (tolerance: none, the same operations in the same order)
    assert all(torch.equal(fabric_params[k], torch_params[k]) for k in torch_params)


def test_a_module_set_up_with_fabric_logs_clips_and_steps_through_it():
    logger = Mock()
    fabric = Fabric(loggers=logger)
    module = Net()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    wrapped, wrapped_optimizer = fabric.setup(module, optimizer)
    assert wrapped is module and wrapped.fabric == fabric
    assert wrapped.logger is logger and wrapped.loggers == [logger] and wrapped.optimizers() is wrapped_optimizer
    wrapped.log("loss", torch.tensor(0.5))
    logger.log_metrics.assert_called_with(metrics={"loss": 0.5}, step=None)
    wrapped.log_dict({"a": 1, "b": 0.25})
    logger.log_metrics.assert_called_with(metrics={"a": 1, "b": 0.25}, step=None)
    logger.reset_mock()
    wrapped.log("nothing", 1, logger=False)
    logger.log_metrics.assert_not_called()
    with pytest.raises(ValueError, match="`list` values cannot be logged"):
        wrapped.log("bad", [1])
    with pytest.raises(ValueError, match="nested dictionaries cannot be logged"):
        wrapped.log_dict({"nested": {"x": 1}})
    fabric.clip_gradients = Mock()
    wrapped.clip_gradients(optimizer, gradient_clip_val=0.5, gradient_clip_algorithm=GradClipAlgorithmType("value"))
    fabric.clip_gradients.assert_called_once_with(module, optimizer, clip_val=0.5, max_norm=None)
    bare = Fabric()  # (held: a module keeps only a weak reference to its Fabric, as Lightning's)
    with pytest.raises(IndexError):
        _ = bare.setup(Net()).logger
    assert bare.setup(Net()).loggers == []


def test_what_this_fabric_does_not_do_is_refused_with_one_line():
    with pytest.raises(ValueError, match=r"Fabric\(devices=2\): this Fabric runs one process on one device"):
        Fabric(devices=2)
    with pytest.raises(ValueError, match=r"Fabric\(precision='16-mixed'\)"):
        Fabric(precision="16-mixed")
    with pytest.raises(ValueError, match=r"Fabric\(strategy='ddp'\)"):
        Fabric(strategy="ddp")
    with pytest.raises(AttributeError, match=r"Fabric.save is not here: .*use trainer.lightning.Trainer"):
        Fabric().save("x.ckpt", {})
    fabric = Fabric(accelerator="cpu")
    assert (fabric.world_size, fabric.global_rank, fabric.is_global_zero, fabric.device) == (1, 0, True,
                                                                                             torch.device("cpu"))
    assert fabric.launch(lambda f, n: (f, n), 3) == (fabric, 3)
    calls = []
    callback = Mock(on_epoch=lambda value: calls.append(value))
    Fabric(callbacks=[callback]).call("on_epoch", value=2)
    assert calls == [2]
