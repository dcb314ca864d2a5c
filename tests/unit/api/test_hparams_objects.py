"""Hyperparameters as Lightning keeps them: objects stay objects in ``self.hparams`` (a partial optimizer,
an ``nn.Module``, a class, ones added after ``save_hyperparameters``), on modules and DataModules; a
checkpoint keeps them so that ``load_from_checkpoint(path)`` rebuilds without arguments, compared with
Lightning itself running the same program (tests/support/hparams_program.py); loggers show them as
readable, redacted text."""

import functools
import json
import logging
import os
import re
import sys
import types
from argparse import Namespace

import pytest
import torch
import yaml

from trainer import DataModule, Trainer, TrainModule
from trainer.runtime.redact import redact_secrets

pytestmark = pytest.mark.timeout(300)

PROGRAM = os.path.join(os.path.dirname(__file__), "..", "..", "support", "hparams_program.py")
SECRET = "sk-" + "q" * 24
#: The import line the port changes; until a Lightning namespace exists, ours is spelled out here.
OUR_IMPORT = ("import trainer\n"
              "L = type('L', (), {'LightningModule': trainer.TrainModule, 'LightningDataModule': trainer.DataModule})")


def program(flavour):
    """The program's module, under Lightning ("lightning") or this trainer ("ours"), importable by name
    (its classes are pickled by reference, as a user's program's are)."""
    name = f"hparams_program_{flavour}"
    if name not in sys.modules:
        source = open(PROGRAM).read()
        if flavour == "ours":
            source = source.replace("import lightning as L", OUR_IMPORT)
        module = types.ModuleType(name)
        sys.modules[name] = module
        exec(compile(source, PROGRAM, "exec"), module.__dict__)
    return sys.modules[name]


def fit_ours(run_dir, module, datamodule=None, steps=4, **args):
    args = {"max_steps": steps, "run_dir": str(run_dir), "loggers": [], "progress_bar": False,
            "checkpoint": dict(every_n_steps=steps, format="full"), **args}
    Trainer(**args).fit(module, datamodule=datamodule)
    return os.path.join(str(run_dir), "checkpoints")


def fit_lightning(run_dir, module, datamodule):
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger

    lit = L.Trainer(max_steps=4, accelerator="cpu", devices=1, logger=CSVLogger(str(run_dir), name="csv"),
                    enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(run_dir))
    lit.fit(module, datamodule=datamodule)
    return lit.checkpoint_callback.best_model_path


def kinds(hparams):
    return {key: type(value) for key, value in hparams.items()}


def same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert set(sa) == set(sb)
    for name in sa:
        torch.testing.assert_close(sa[name], sb[name], rtol=0, atol=0)


# ----- in self.hparams ---------------------------------------------------------------------------------------
def test_objects_stay_objects_with_later_additions_and_the_initial_copy():
    module, data = program("ours").build()
    assert kinds(module.hparams) == {
        "net": program("ours").Net, "optimizer": functools.partial, "activation": type, "betas": tuple,
        "client": type(None), "note": str, "loss": torch.nn.MSELoss, "scheduler": functools.partial}
    assert module.hparams.net is module.net and module.hparams.activation is torch.nn.Tanh
    assert sorted(module.hparams_initial) == ["activation", "betas", "client", "net", "note", "optimizer"]
    assert dict(data.hparams) == {"batch_size": 4, "samples": 16, "scale": (1.0, 2.0)}


def idioms(base):
    """Three ways of calling save_hyperparameters, on ``base`` (ours or Lightning's module class)."""

    class Frames(base):
        def __init__(self, lr=0.1, width=3, table=None):
            super().__init__()
            self._save(logger=False)

        def _save(self, logger):  # called from __init__: its frame is found above this one
            self.save_hyperparameters(ignore="table", logger=logger)

    class Twice(Frames):
        def __init__(self, depth=2, lr=0.3):
            super().__init__(lr=lr)
            self.save_hyperparameters(ignore="width")  # adds to the base's, drops one of them

    class Explicit(base):
        def __init__(self, a=1, b=2):
            super().__init__()
            self._later(sys._getframe())

        def _later(self, frame):
            self.save_hyperparameters("a", frame=frame)

    return [Frames(lr=0.2), Twice(depth=5), Explicit(a=4)]


class FromConfig(DataModule):
    def __init__(self, config):
        super().__init__()
        self.save_hyperparameters(config)


def test_frame_logger_a_second_call_and_a_namespace():
    import lightning as L

    ours, theirs = idioms(TrainModule), idioms(L.LightningModule)
    assert [dict(m.hparams) for m in ours] == [{"lr": 0.2, "width": 3}, {"lr": 0.3, "depth": 5}, {"a": 4}]
    assert [dict(m.hparams) for m in ours] == [dict(m.hparams) for m in theirs]
    assert ours[0]._log_hyperparams is theirs[0]._log_hyperparams is False

    def build(lr=0.5):
        frame = sys._getframe()
        module = TrainModule.__new__(TrainModule)
        TrainModule.__init__(module)
        with pytest.raises(RuntimeError, match="must be called from TrainModule.__init__"):
            module.save_hyperparameters(frame=frame)  # a frame that is not the module's __init__

    build()
    data = FromConfig(Namespace(batch_size=8, root="/d"))
    assert dict(data.hparams) == {"batch_size": 8, "root": "/d"} and data._hparams_name == "config"
    # Saved from the dict given as `config`: load_from_checkpoint passes them back under that name.
    from trainer.checkpoint.load_module import SavedHparams, _arguments

    saved = SavedHparams(values={"batch_size": 8, "root": "/d"}, name="config")
    assert _arguments(FromConfig, "ckpt", saved, {}) == {"config": {"batch_size": 8, "root": "/d"}}


class Logged(DataModule):
    def __init__(self, lr=0.1, size=4):
        super().__init__()
        self.save_hyperparameters()


def test_module_and_datamodule_hparams_go_to_the_loggers_together_and_a_clash_is_an_error():
    from trainer.api.hparams import merged_for_loggers

    frames = idioms(TrainModule)[0]
    assert merged_for_loggers(frames, Logged(lr=0.2)) == {"lr": 0.2, "size": 4}  # logger=False: not logged
    assert merged_for_loggers(Logged(), Logged()) == {"lr": 0.1, "size": 4}
    with pytest.raises(RuntimeError, match=r"\['size'\] are saved by both Logged and Logged with different values"):
        merged_for_loggers(Logged(size=4), Logged(size=5))


# ----- checkpoints: the same rebuild as Lightning ----------------------------------------------------------------
def test_load_from_checkpoint_rebuilds_objects_like_lightning(tmp_path):
    ours = program("ours")
    module, data = ours.build()
    root = fit_ours(tmp_path / "ours", module, data, loggers=["csv"])
    loaded = ours.Lit.load_from_checkpoint(root)
    same_weights(loaded, module)
    assert loaded.hparams.net is loaded.net  # the rebuilt module holds the unpickled net, loaded with the trained weights
    assert loaded.hparams.optimizer.func is torch.optim.AdamW and loaded.hparams.optimizer.keywords == {"lr": 1e-3}
    assert loaded.hparams.scheduler.func is torch.optim.lr_scheduler.StepLR and loaded.hparams.betas == (0.9, 0.99)
    loaded_data = ours.Data.load_from_checkpoint(checkpoint_path=root)  # Lightning's keyword
    assert dict(loaded_data.hparams) == dict(data.hparams)

    lightning = program("lightning")
    lit_module, lit_data = lightning.build()
    path = fit_lightning(tmp_path / "lightning", lit_module, lit_data)
    lit_loaded = lightning.Lit.load_from_checkpoint(path, weights_only=False)  # Lightning needs it for objects
    same_weights(lit_loaded, lit_module)
    assert lit_loaded.hparams.net is lit_loaded.net
    # The same keys, the same type of every value, after the load as before it.
    rename = {lightning.Net: ours.Net}
    assert kinds(loaded.hparams) == {k: rename.get(v, v) for k, v in kinds(lit_loaded.hparams).items()}
    assert kinds(loaded.hparams) == kinds(module.hparams)
    assert kinds(loaded_data.hparams) == kinds(lightning.Data.load_from_checkpoint(path, weights_only=False).hparams)
    # The same training (one process, no shuffling): Lightning's weights are ours.
    for (name, a), (_, b) in zip(module.state_dict().items(), lit_module.state_dict().items()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    # hparams.yaml: the keys Lightning's has (the module's and the datamodule's, as first saved).
    lit_yaml = open(os.path.join(os.path.dirname(os.path.dirname(path)), "hparams.yaml")).read()
    ours_yaml = yaml.safe_load(open(tmp_path / "ours" / "hparams.yaml"))
    assert sorted(ours_yaml) == sorted(re.findall(r"^(\w+):", lit_yaml, re.M))


def test_hparams_yaml_and_loggers_readable_and_redacted_everywhere(tmp_path, caplog):
    ours = program("ours")
    module, data = ours.build(client=functools.partial(ours.Client, api_key=SECRET, retries=2))
    root = fit_ours(tmp_path, module, data, loggers=["csv", "tensorboard"])
    shown = yaml.safe_load(open(tmp_path / "hparams.yaml"))
    assert shown["optimizer"] == "functools.partial(torch.optim.AdamW, lr=0.001)"
    assert shown["activation"] == "torch.nn.Tanh" and shown["betas"] == [0.9, 0.99]
    assert shown["client"] == "functools.partial(hparams_program_ours.Client, api_key='***', retries=2)"
    assert shown["net"].splitlines()[:3] == ["Net(", "  (body): Sequential(",
                                             "    (0): Linear(in_features=3, out_features=5, bias=True)"]
    assert shown["batch_size"] == 4 and "loss" not in shown  # added after save_hyperparameters: not logged
    assert "!!python" not in open(tmp_path / "hparams.yaml").read()
    events = b"".join(path.read_bytes() for path in tmp_path.glob("events.out.tfevents.*"))
    assert b"functools.partial(torch.optim.AdamW, lr=0.001)" in events  # TensorBoard's HPARAMS tab and text
    for path in tmp_path.rglob("*"):  # event files, trainer_state.json, hparams.pt: no secret anywhere
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    state = json.load(open(os.path.join(root, "step-000000004", "trainer_state.json")))
    assert state["hparams"]["redacted"] == ["client"] and "client" not in state["hparams"]["objects"]
    assert state["datamodule_hparams"]["values"] == {"batch_size": 4, "samples": 16, "scale": [1.0, 2.0]}
    with pytest.raises(ValueError, match=r"\['client'\] were redacted .* load_from_checkpoint\(path, client=\.\.\.\)"):
        ours.Lit.load_from_checkpoint(root)
    with pytest.raises(ValueError, match="hparams_file=...\\): not supported here"):
        ours.Lit.load_from_checkpoint(root, hparams_file="hparams.yaml")
    client = functools.partial(ours.Client, api_key="given-again")
    assert ours.Lit.load_from_checkpoint(root, client=client).hparams.client is client


def test_redaction_reads_assignments_inside_text():
    assert redact_secrets({"a": "functools.partial(Client, api_key='sk-1', n=2)", "b": "{'password': 'pw', 'x': 1}",
                           "c": "https://h/p?token=abc&page=2", "d": "max_tokens=5 key_dim=3", "e": 'X(auth="a b")'}) == {
        "a": "functools.partial(Client, api_key='***', n=2)", "b": "{'password': '***', 'x': 1}",
        "c": "https://h/p?token=***&page=2", "d": "max_tokens=5 key_dim=3", "e": 'X(auth="***")'}


def test_a_value_that_cannot_be_pickled_is_named_when_training_starts_and_when_loading(tmp_path, caplog):
    ours = program("ours")
    module, _ = ours.build()
    module.hparams.transform = lambda x: x  # cannot be pickled
    with caplog.at_level(logging.WARNING, logger="trainer.api.hparams_archive"):
        root = fit_ours(tmp_path, module, ours.Data())
    assert "hyperparameter 'transform' of Lit (a function) cannot be pickled" in caplog.text
    # Lit.__init__ does not take it: the rebuild needs nothing else...
    assert ours.Lit.load_from_checkpoint(root).hparams.optimizer.func is torch.optim.AdamW

    class Takes(TrainModule):
        def __init__(self, fn=None, width=2):
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(width, 1)

        def training_step(self, batch, batch_idx):
            return self.hparams.fn(self.layer(batch)).mean()

        def train_dataset(self):
            return torch.randn(8, 2)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    root = fit_ours(tmp_path / "takes", Takes(fn=lambda y: y ** 2), batch_size=4)
    with pytest.raises(ValueError, match=r"\['fn'\] cannot be rebuilt from the checkpoint \(fn: it could not be "
                                         r"pickled .*load_from_checkpoint\(path, fn=\.\.\.\)"):
        Takes.load_from_checkpoint(root)
    assert Takes.load_from_checkpoint(root, fn=torch.square).hparams.width == 2


def test_weights_only_loads_no_object_and_resuming_never_reads_them(tmp_path):
    ours = program("ours")
    module, data = ours.build()
    root = fit_ours(tmp_path, module, data)
    with pytest.raises(ValueError, match=r"\['activation', 'betas', 'net', 'optimizer'\] cannot be rebuilt .*"
                                         r"weights_only=True does not unpickle objects"):
        ours.Lit.load_from_checkpoint(root, weights_only=True)
    # A resume reads the checkpoint with weights_only=True and never opens hparams.pt: garbage of the same size there
    # (the integrity check compares sizes) changes nothing.
    pickled = os.path.join(root, "step-000000004", "hparams.pt")
    size = os.path.getsize(pickled)
    with open(pickled, "wb") as handle:
        handle.write(b"\0" * size)
    resumed, data = ours.build()
    fit_ours(tmp_path, resumed, data, steps=6, resume=os.path.join(root, "step-000000004"))
    assert os.path.isdir(os.path.join(root, "step-000000006"))


def test_fsdp_changing_the_net_in_place_still_rebuilds(tmp_path, monkeypatch):
    """FSDP makes ``net`` a unit of its own and changes its class in place: the hyperparameter is
    pickled when training starts, before that, so the two-rank checkpoint rebuilds in one process."""
    from trainer.strategies.fsdp import FSDPStrategy

    source = open(PROGRAM).read().replace("import lightning as L", OUR_IMPORT)
    (tmp_path / "hparams_program_spawned.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))  # the spawned ranks import the program by name
    import hparams_program_spawned as spawned

    module, data = spawned.build()
    root = fit_ours(tmp_path / "run", module, data, devices=2, batch_size=4, strategy=FSDPStrategy(wrap=["Net"]),
                    collective_timeout_s=120)
    loaded = spawned.Lit.load_from_checkpoint(root)
    assert type(loaded.net) is spawned.Net and loaded.hparams.net is loaded.net
    same_weights(loaded, module)
