"""A checkpoint as one file in Lightning's ``.ckpt`` shape, and back to a checkpoint folder.

``packed`` gives the content of one ``torch.save`` file that Lightning reads (``torch.load`` keys
``state_dict``, ``epoch``, ``global_step``, ``callbacks``, ``optimizer_states``, ``lr_schedulers``,
``hyper_parameters``, ``pytorch-lightning_version``) and that still holds everything this trainer
needs to resume exactly, under the key ``meshtrainer``: the commit marker and the small files of a
full-format checkpoint folder (``layout.py``), ``trainer_state.json`` as bytes (a ``uint8``
tensor) and the others as the values their ``.pt`` files hold (``objects``), all read by
``torch.load(weights_only=True)``. The weights are stored once (``state_dict`` and the resume part
share the tensors). `write_atomic` writes it under a temporary name, fsynced and renamed: a reader
sees the old file or the new one.

``unpacked`` gives the folder a packed file holds (written once per file version into a
temporary directory of this process), so every loader of folders (``ckpt_path=``,
``load_from_checkpoint``, ``python -m trainer.checkpoint``) reads packed files too (also those
written when every small file was bytes).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from typing import Any

import torch

from trainer.checkpoint import integrity, layout
from trainer.checkpoint.file_state import FileState
from trainer.runtime.redact import redact_secrets

KEY = "meshtrainer"
MODEL_OPTIM = "model_optim.pt"
#: the Lightning version a packed file claims (Lightning migrates older files by it)
LIGHTNING_VERSION = "2.6.0"

_unpacked: dict[tuple[str, int, int], str] = {}


def _as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)


def packed(state: FileState, weights_only: bool = False, hparams: dict[str, Any] | None = None,
           optimizer_states: list | None = None) -> dict[str, Any]:
    """The content of the file for the checkpoint ``state`` (rank 0's, `file_state.gather_file_state`).
    ``weights_only``: the model's weights and progress only (no optimizer, scheduler or callback
    state; such a file cannot be resumed from). ``hparams``: the module's hyperparameters
    (Lightning's ``hyper_parameters``); ``optimizer_states``: Lightning's ``optimizer_states``."""
    progress = state.progress
    # Checkpoints are shared and uploaded: no secret of the config in them (never read back).
    text = json.dumps(redact_secrets(progress), indent=1, default=str).encode("utf-8")
    objects = {"extras.pt": state.extras, **state.objects}
    if weights_only:
        objects = {rel: value for rel, value in objects.items() if rel.startswith("hparams")}
    resume = {"marker": json.dumps({**state.marker, "weights_only": weights_only}),
              "files": {"trainer_state.json": _as_tensor(text)}, "objects": objects}
    if not weights_only:
        resume["optim"] = state.training.get("optim")
    checkpoint: dict[str, Any] = {
        "epoch": int(progress.get("epoch", 0)), "global_step": int(progress.get("global_step", progress["step"])),
        "pytorch-lightning_version": LIGHTNING_VERSION, "state_dict": state.training["model"], KEY: resume,
    }
    if hparams:
        checkpoint["hyper_parameters"] = hparams
    if not weights_only:
        # (Lightning's keys: a callback whose state is empty has none)
        callbacks = {k: v for k, v in (state.extras.get("callbacks") or {}).items() if v and not k.startswith("__")}
        optim = state.training.get("optim")
        checkpoint.update(callbacks=callbacks, lr_schedulers=_schedulers(state.extras.get("scheduler")),
                          optimizer_states=optimizer_states if optimizer_states is not None else [optim])
    return checkpoint


def _schedulers(state: Any) -> list:
    if state is None:
        return []
    return list(state) if isinstance(state, (list, tuple)) else [state]


def write_atomic(checkpoint: dict[str, Any], path: str) -> None:
    """``torch.save`` to a temporary name beside ``path``, fsync, rename over ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    temporary = os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        torch.save(checkpoint, temporary)
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)
    layout._fsync_dir(folder)


def is_packed(path: str) -> bool:
    """Whether ``path`` is a file this module packed."""
    if not os.path.isfile(path):
        return False
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # not a torch file, or not one of ours
        return False
    return isinstance(loaded, dict) and KEY in loaded


def unpacked(path: str) -> str:
    """The checkpoint folder the packed file ``path`` holds (made once per version of the file)."""
    path = os.path.abspath(path)
    stat = os.stat(path)
    key = (path, stat.st_mtime_ns, stat.st_size)
    if key in _unpacked and os.path.isdir(_unpacked[key]):
        return _unpacked[key]
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    resume = loaded[KEY]
    marker = json.loads(resume["marker"])
    folder = tempfile.mkdtemp(prefix="meshtrainer-ckpt-")
    atexit.register(shutil.rmtree, folder, True)
    for rel, data in resume["files"].items():  # raw bytes (every file, in files written before "objects")
        os.makedirs(os.path.dirname(os.path.join(folder, rel)), exist_ok=True)
        with open(os.path.join(folder, rel), "wb") as handle:
            handle.write(data.numpy().tobytes())
    for rel, value in resume.get("objects", {}).items():
        os.makedirs(os.path.dirname(os.path.join(folder, rel)), exist_ok=True)
        torch.save(value, os.path.join(folder, rel))
    state = {"model": loaded["state_dict"]}
    if "optim" in resume:
        state["optim"] = resume["optim"]
    torch.save(state, os.path.join(folder, MODEL_OPTIM))
    # the file's own integrity is torch.load's to check; the folder rebuilt from it is complete
    marker[integrity.FILES] = integrity.sizes(folder, [*resume["files"], *resume.get("objects", {})])
    marker["packed_from"] = path
    with open(os.path.join(folder, layout.COMMITTED), "w", encoding="utf-8") as handle:
        json.dump(marker, handle)
    _unpacked[key] = folder
    return folder


def folder_of(path: str) -> str:
    """``path``, or the folder it holds when it is a packed file."""
    return unpacked(path) if is_packed(path) else path
