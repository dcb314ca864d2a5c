"""``TrainModule.load_from_checkpoint``: a module rebuilt from a checkpoint's hyperparameters and
weights, in one process, without torch.distributed.

Reads any checkpoint this trainer writes: a full-format file (``model_optim.pt``, or the
``{name: tensor}`` file ``python -m trainer.checkpoint consolidate`` writes), a checkpoint directory
(full or sharded, whichever strategy saved it: sharded ones are consolidated in memory) or a
directory of checkpoints (its latest committed one). The hyperparameters come from the checkpoint's
``trainer_state.json`` (``save_hyperparameters``), the objects among them from its ``hparams.pt``
(unpickled here only, on this explicit call); a file outside a checkpoint directory has none.
"""

from __future__ import annotations

import inspect
import io
import json
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.api.hparams_archive import FILENAME, PARTS
from trainer.checkpoint import layout
from trainer.checkpoint.consolidate import full_weights
from trainer.checkpoint.manager import CheckpointError, load_file


def _checkpoint_dir(path: str) -> str | None:
    """The checkpoint directory ``path`` names or lies in (None: a loose weights file)."""
    path = os.path.abspath(path)
    if os.path.isfile(path):
        folder = os.path.dirname(path)
        return folder if layout.is_committed(folder) else None
    if layout.is_committed(path):
        return path
    if os.path.isdir(path):
        latest = layout.find_latest(path)
        if latest is None:
            raise CheckpointError(f"{path}: no committed checkpoint there (a complete one has a "
                                  f"{layout.COMMITTED} file)")
        return latest
    raise CheckpointError(f"{path}: no such file or directory")


@dataclass
class SavedHparams:
    """The hyperparameters a checkpoint holds for one class (its module or its datamodule)."""

    values: dict[str, Any] = field(default_factory=dict)  # what can be passed back to __init__
    redacted: list[str] = field(default_factory=list)  # secrets: never stored
    unstored: dict[str, str] = field(default_factory=dict)  # objects not read back: key -> why
    name: str | None = None  # the init argument they came in as one dict


def saved_hparams(checkpoint: str | None, part: str = "module", weights_only: bool | None = None,
                  map_location: Any = None) -> SavedHparams:
    """The hyperparameters recorded in a checkpoint directory (``part``: "module" or "datamodule");
    empty if none. Objects are unpickled from ``hparams.pt`` unless ``weights_only``."""
    if checkpoint is None:
        return SavedHparams()
    state_file = os.path.join(checkpoint, "trainer_state.json")
    if not os.path.isfile(state_file):
        return SavedHparams()
    with open(state_file, encoding="utf-8") as handle:
        record = json.load(handle).get(PARTS[part]) or {}
    saved = SavedHparams(dict(record.get("values") or {}), list(record.get("redacted") or []), {}, record.get("name"))
    for key in saved.redacted:
        saved.values.pop(key, None)
    objects = list(record.get("objects") or [])
    for key in objects:
        saved.values.pop(key, None)  # its text, not the object
    if not objects:
        return saved
    if weights_only:
        saved.unstored = {key: "weights_only=True does not unpickle objects" for key in objects}
        return saved
    blobs = _pickled(checkpoint).get(part, {})
    for key in objects:
        if key not in blobs:
            saved.unstored[key] = "it could not be pickled when the checkpoint was written (a warning named it then)"
            continue
        try:
            saved.values[key] = torch.load(io.BytesIO(blobs[key]), map_location=map_location, weights_only=False)
        except Exception as error:
            saved.unstored[key] = f"unpickling it failed ({type(error).__name__}: {error})"
    return saved


def _pickled(checkpoint: str) -> dict[str, dict[str, bytes]]:
    path = os.path.join(checkpoint, FILENAME)
    return load_file(path) if os.path.isfile(path) else {}


def _arguments(cls: type, path: str, saved: SavedHparams, overrides: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments ``cls`` is built with: the saved hyperparameters, ``overrides`` winning."""
    required, accepted = _init_parameters(cls)
    if "hparams_file" in overrides and accepted is not None and "hparams_file" not in accepted:
        raise ValueError(f"{cls.__name__}.load_from_checkpoint(hparams_file=...): not supported here (the checkpoint "
                         "holds the hyperparameters, objects included); pass the values to change as keyword "
                         "arguments: load_from_checkpoint(path, lr=...)")
    as_one = saved.name is not None and (accepted is None or saved.name in accepted) and saved.name not in overrides

    def needed(key: str) -> bool:  # a key __init__ takes (others are not passed: their loss does not matter)
        return key not in overrides and (as_one or accepted is None or key in accepted)

    missing_secrets = [key for key in saved.redacted if needed(key)]
    if missing_secrets:
        raise ValueError(
            f"{cls.__name__}.load_from_checkpoint: the hyperparameter(s) {missing_secrets} were redacted when the "
            f"checkpoint was written (secrets are never stored); pass them again: "
            f"load_from_checkpoint(path, {', '.join(k + '=...' for k in missing_secrets)})"
        )
    unstored = {key: why for key, why in saved.unstored.items() if needed(key)}
    if unstored:
        raise ValueError(
            f"{cls.__name__}.load_from_checkpoint: the hyperparameter(s) {sorted(unstored)} cannot be rebuilt from the "
            f"checkpoint ({'; '.join(f'{k}: {why}' for k, why in sorted(unstored.items()))}); pass them: "
            f"load_from_checkpoint(path, {', '.join(k + '=...' for k in sorted(unstored))})"
        )
    hparams = dict(saved.values)
    if as_one:
        hparams = {saved.name: hparams}  # save_hyperparameters(config): __init__(self, config) gets it back
    if accepted is not None:  # only what __init__ takes (not keys added to self.hparams later, as Lightning)
        hparams = {key: value for key, value in hparams.items() if key in accepted}
    arguments = {**hparams, **overrides}
    missing = [name for name in required if name not in arguments]
    if missing:
        where = "its saved hyperparameters" if hparams else "no saved hyperparameters (save_hyperparameters() not called)"
        raise TypeError(f"{cls.__name__}.load_from_checkpoint({path!r}): {cls.__name__}.__init__ needs {missing}, "
                        f"and the checkpoint has {where}; pass them: load_from_checkpoint(path, "
                        f"{', '.join(k + '=...' for k in missing)})")
    return arguments


def _weights(path: str, checkpoint: str | None, map_location: Any) -> dict[str, torch.Tensor]:
    if os.path.isfile(path):
        if map_location is None:
            loaded = load_file(path)
        else:
            try:
                loaded = torch.load(path, map_location=map_location, weights_only=True)
            except Exception as error:
                raise CheckpointError(f"{path}: cannot be read ({type(error).__name__}: {error})") from None
        return loaded["model"] if isinstance(loaded, dict) and isinstance(loaded.get("model"), dict) else loaded
    with warnings.catch_warnings():  # DCP's note that it reads without a process group: intended here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        weights = full_weights(checkpoint)
    if map_location is not None:
        if callable(map_location) or isinstance(map_location, dict):
            raise ValueError(f"load_from_checkpoint({path!r}, map_location={map_location!r}): a sharded checkpoint "
                             "is read into CPU tensors; give a device (\"cuda:0\", torch.device(...)) or None, or a "
                             "full-format file (python -m trainer.checkpoint consolidate) for a callable / dict")
        weights = {name: tensor.to(map_location) for name, tensor in weights.items()}
    return weights


def _path(cls: type, path: Any, overrides: dict[str, Any]) -> str:
    """The checkpoint path, given as ``path`` or as Lightning's ``checkpoint_path=`` keyword."""
    if "checkpoint_path" in overrides and path is None:
        path = overrides.pop("checkpoint_path")
    if path is None:
        raise TypeError(f"{cls.__name__}.load_from_checkpoint() needs the checkpoint's path")
    from trainer.checkpoint.single_file import folder_of

    return folder_of(os.fspath(path))  # a checkpoint file (Lightning's .ckpt shape): the folder it holds


def _init_parameters(cls: type) -> tuple[list[str], list[str] | None]:
    """(required argument names, accepted names; None: any, as with ``**kwargs``) of ``cls.__init__``."""
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    named = [p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    required = [p.name for p in named if p.default is inspect.Parameter.empty]
    accepts_any = any(p.kind == p.VAR_KEYWORD for p in parameters)
    return required, None if accepts_any else [p.name for p in named]


def load_from_checkpoint(cls: type, path: str | None, map_location: Any = None, strict: bool = True,
                         weights_only: bool | None = None, **overrides: Any) -> Any:
    """See ``TrainModule.load_from_checkpoint``."""
    path = _path(cls, path, overrides)
    checkpoint = _checkpoint_dir(path)
    saved = saved_hparams(checkpoint, "module", weights_only, map_location)
    arguments = _arguments(cls, path, saved, overrides)
    module = cls(**arguments)
    weights = _weights(path, checkpoint, map_location)
    own = set(module.state_dict())
    if any(name not in own for name in weights):  # layers built in configure_model()
        module.configure_model()
    try:
        module.load_state_dict(weights, strict=strict)
    except RuntimeError as error:
        raise CheckpointError(f"{path}: the weights do not fit {cls.__name__} built from "
                              f"{sorted(arguments)}: {error}") from None
    if map_location is not None and not callable(map_location) and not isinstance(map_location, dict):
        module.to(map_location)
    return module


def load_datamodule_from_checkpoint(cls: type, path: str | None, weights_only: bool | None = None, **overrides: Any) -> Any:
    """See ``DataModule.load_from_checkpoint``."""
    path = _path(cls, path, overrides)
    checkpoint = _checkpoint_dir(path)
    saved = saved_hparams(checkpoint, "datamodule", weights_only)
    return cls(**_arguments(cls, path, saved, overrides))
