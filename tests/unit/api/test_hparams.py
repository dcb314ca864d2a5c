"""save_hyperparameters, hparams in checkpoints and loggers, and load_from_checkpoint from every
checkpoint shape (one process, without torch.distributed)."""

import json
import logging
import os

import pytest
import torch
import yaml

from tests.support.helpers import BlockRegressor, run_trainer
from trainer import TrainModule
from trainer.checkpoint import CheckpointError
from trainer.strategies.ddp import DDPStrategy
from trainer.strategies.fsdp import FSDPStrategy
from trainer.strategies.pipeline import PipelineStrategy

pytestmark = pytest.mark.timeout(300)


class Saved(BlockRegressor):
    """A BlockRegressor that saves its init arguments (a secret among them; the tensor is skipped)."""

    def __init__(self, width: int, depth: int = 2, lr: float = 0.01, api_key: str = "", note=None, **extra):
        super().__init__(lr=lr, width=width, depth=depth)
        self.save_hyperparameters(ignore="note")


class Chosen(TrainModule):
    def __init__(self, lr: float = 0.1, width: int = 4, layer=None):
        super().__init__()
        self.save_hyperparameters("lr", "width")


class WithLayer(TrainModule):
    def __init__(self, lr: float = 0.1, layer=None):
        super().__init__()
        self.save_hyperparameters()


class Unsaved(BlockRegressor):
    """Required init args but no save_hyperparameters()."""

    def __init__(self, width: int, depth: int):
        super().__init__(width=width, depth=depth)


def _fit(run_dir, module, **args):
    args = {"max_steps": 4, "checkpoint": dict(every_n_steps=4, format="sharded"), **args}
    run_trainer(run_dir, module, **args)
    return os.path.join(str(run_dir), "checkpoints")


def _trained(run_dir):
    return torch.load(os.path.join(str(run_dir), "params.pt"))


# ----- forms ------------------------------------------------------------------------------------------------
def test_all_init_arguments_by_name_with_attribute_and_item_access():
    module = Saved(8, lr=0.5, api_key="k" * 12, note="dropped", seed=3)
    assert dict(module.hparams) == {"width": 8, "depth": 2, "lr": 0.5, "api_key": "k" * 12, "seed": 3}
    assert module.hparams.width == module.hparams["width"] == 8
    with pytest.raises(AttributeError, match="no hyperparameter 'nope'"):
        module.hparams.nope


def test_explicit_names_a_dict_and_errors_naming_the_bad_name(caplog):
    assert dict(Chosen(lr=0.3).hparams) == {"lr": 0.3, "width": 4}

    class FromDict(TrainModule):
        def __init__(self):
            super().__init__()
            self.save_hyperparameters({"a": 1})

    assert FromDict().hparams.a == 1

    class BadName(TrainModule):
        def __init__(self, lr: float = 0.1):
            super().__init__()
            self.save_hyperparameters("learning_rate")

    with pytest.raises(ValueError, match=r"\['learning_rate'\] are not arguments of BadName.__init__; its arguments are \['lr'\]"):
        BadName()

    class BadIgnore(TrainModule):
        def __init__(self, lr: float = 0.1):
            super().__init__()
            self.save_hyperparameters(ignore=["lrr"])

    with caplog.at_level(logging.WARNING, logger="trainer.api.hparams"):
        assert dict(BadIgnore().hparams) == {"lr": 0.1}  # as Lightning: nothing to leave out, but said
    assert "ignore=['lrr']): ['lrr'] are not among the hyperparameters ['lr']" in caplog.text
    with pytest.raises(RuntimeError, match=r"must be called from TrainModule.__init__"):
        TrainModule().save_hyperparameters()


class Base(TrainModule):
    def __init__(self, a: int = 1, **rest):
        super().__init__()
        self.save_hyperparameters()


class Child(Base):
    def __init__(self, b: int = 2, a: int = 5):
        super().__init__(a=a, c=3)


def test_a_chain_of_inits_keeps_the_most_derived_values():
    assert dict(Child(b=4).hparams) == {"a": 5, "c": 3, "b": 4}


def test_an_object_is_kept_as_it_is():
    layer = torch.nn.Linear(2, 2)
    module = WithLayer(lr=0.2, layer=layer)
    assert dict(module.hparams) == {"lr": 0.2, "layer": layer} and module.hparams.layer is layer


# ----- checkpoints and loggers --------------------------------------------------------------------------------
def test_hparams_in_checkpoint_and_every_logger_with_secrets_redacted(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    secret = "sk-" + "x" * 20
    root = _fit(tmp_path, Saved(8, api_key=secret), loggers=["jsonl", "csv", "tensorboard"],
                config={"recipe": "unit"})
    state = json.load(open(os.path.join(root, "step-000000004", "trainer_state.json")))
    assert state["hparams"] == {"values": {"width": 8, "depth": 2, "lr": 0.01, "api_key": "***"}, "redacted": ["api_key"],
                                "objects": [], "name": None}
    written = yaml.safe_load(open(tmp_path / "hparams.yaml"))
    assert written == {"recipe": "unit", "hparams": {"width": 8, "depth": 2, "lr": 0.01, "api_key": "***"}}
    events = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    events.Reload()
    plugin = events.PluginTagToContent("hparams")
    assert "_hparams_/session_start_info" in plugin
    start = plugin["_hparams_/session_start_info"]
    assert b"hparams/width" in start and secret.encode() not in start
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), path


# ----- load_from_checkpoint ---------------------------------------------------------------------------------
def _same(module, params):
    state = module.state_dict()
    assert set(state) == set(params)
    for name, value in params.items():
        torch.testing.assert_close(state[name], value, rtol=0, atol=0)


def test_load_full_file_directory_and_checkpoints_dir_with_overrides(tmp_path):
    root = _fit(tmp_path, Saved(8, depth=3), checkpoint=dict(every_n_steps=2, format="full"))
    params = _trained(tmp_path)
    latest = os.path.join(root, "step-000000004")
    for path in (root, latest, os.path.join(latest, "model_optim.pt")):
        module = Saved.load_from_checkpoint(path)
        assert isinstance(module, Saved) and module.hparams.depth == 3 and module.hparams.width == 8
        _same(module, params)
    # Overrides win (and a setting that does not change the weights' shapes keeps strict loading working).
    assert Saved.load_from_checkpoint(root, lr=0.5).hparams.lr == 0.5
    with pytest.raises(CheckpointError, match="do not fit Saved"):
        Saved.load_from_checkpoint(root, depth=2)
    assert Saved.load_from_checkpoint(root, depth=2, strict=False).hparams.depth == 2
    assert Saved.load_from_checkpoint(root, map_location="cpu").device == torch.device("cpu")


def test_python_run_logs_the_hparams_alone(tmp_path):
    _fit(tmp_path, Saved(8), loggers=["csv"], checkpoint=None)
    assert yaml.safe_load(open(tmp_path / "hparams.yaml")) == {"width": 8, "depth": 2, "lr": 0.01, "api_key": ""}


SHARDED = {"ddp": DDPStrategy, "zero1": lambda: DDPStrategy(zero1=True), "fsdp": FSDPStrategy,
           "pipeline": lambda: PipelineStrategy(microbatches=2)}


@pytest.mark.parametrize("layout", list(SHARDED))
def test_load_sharded_checkpoints_of_two_ranks_in_one_process(tmp_path, layout):
    strategy = SHARDED[layout]()
    root = _fit(tmp_path, Saved(8), strategy=strategy, devices=2, batch_size=8)
    assert not torch.distributed.is_initialized()
    module = Saved.load_from_checkpoint(root)
    assert not torch.distributed.is_initialized()
    _same(module, _trained(tmp_path))


def test_redacted_key_must_be_passed_again(tmp_path):
    root = _fit(tmp_path, Saved(8, api_key="a-secret-value"))
    with pytest.raises(ValueError, match=r"\['api_key'\] were redacted .* load_from_checkpoint\(path, api_key=\.\.\.\)"):
        Saved.load_from_checkpoint(root)
    module = Saved.load_from_checkpoint(root, api_key="given-again")
    assert module.hparams.api_key == "given-again"
    _same(module, _trained(tmp_path))


def test_module_without_hparams_names_its_missing_arguments(tmp_path):
    root = _fit(tmp_path, Unsaved(width=8, depth=2))
    with pytest.raises(TypeError, match=r"needs \['width', 'depth'\].*save_hyperparameters\(\) not called"):
        Unsaved.load_from_checkpoint(root)
    _same(Unsaved.load_from_checkpoint(root, width=8, depth=2, map_location="cpu"), _trained(tmp_path))
    with pytest.raises(ValueError, match="a sharded checkpoint is read into CPU tensors"):
        Unsaved.load_from_checkpoint(root, width=8, depth=2, map_location=lambda storage, location: storage)


def test_the_mlp_recipe_saves_its_model_settings_without_the_factories(caplog):
    from functools import partial

    from trainer.recipes.mlp import MLPClassifier

    with caplog.at_level(logging.WARNING):
        module = MLPClassifier(optimizer=partial(torch.optim.SGD, lr=0.1), hidden=32)
    assert dict(module.hparams) == {"num_features": 20, "num_classes": 4, "hidden": 32, "num_samples": 2048,
                                    "val_samples": 512, "data_seed": 1234}
    assert "not saved" not in caplog.text
