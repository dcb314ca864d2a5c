"""A committed checkpoint folder as one file in Lightning's ``.ckpt`` shape, and back.

``pack`` turns a committed full-format checkpoint folder (``layout.py``) into one ``torch.save``
file that Lightning reads (``torch.load`` keys ``state_dict``, ``epoch``, ``global_step``,
``callbacks``, ``optimizer_states``, ``lr_schedulers``, ``hyper_parameters``,
``pytorch-lightning_version``) and that still holds everything this trainer needs to resume
exactly, under the key ``meshtrainer``: the commit marker and every small file of the folder as
bytes (a ``uint8`` tensor each, so that ``torch.load(weights_only=True)`` reads the file). The
weights are stored once (``state_dict`` and the resume part share the tensors). The file is
written under a temporary name, fsynced and renamed: a reader sees the old file or the new one.

``unpacked`` gives the folder a packed file holds (written once per file version into a
temporary directory of this process), so every loader of folders (``ckpt_path=``,
``load_from_checkpoint``, ``python -m trainer.checkpoint``) reads packed files too.
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

KEY = "meshtrainer"
MODEL_OPTIM = "model_optim.pt"
#: the Lightning version a packed file claims (Lightning migrates older files by it)
LIGHTNING_VERSION = "2.6.0"

_unpacked: dict[tuple[str, int, int], str] = {}


def _as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)


def _read(folder: str, rel: str) -> bytes:
    with open(os.path.join(folder, rel), "rb") as handle:
        return handle.read()


def pack(folder: str, path: str, weights_only: bool = False, hparams: dict[str, Any] | None = None,
         optimizer_states: list | None = None) -> None:
    """Write the committed full-format checkpoint ``folder`` as the single file ``path`` (rank 0).
    ``weights_only``: the model's weights and progress only (no optimizer, scheduler or callback
    state; such a file cannot be resumed from). ``hparams``: the module's hyperparameters
    (Lightning's ``hyper_parameters``); ``optimizer_states``: Lightning's ``optimizer_states``."""
    marker = layout.read_marker(folder)
    if marker["format"] != "full":
        raise ValueError(f"{folder}: only a full-format checkpoint is packed into one file (sharded ones stay folders)")
    state = torch.load(os.path.join(folder, MODEL_OPTIM), map_location="cpu", weights_only=True)
    progress = json.loads(_read(folder, "trainer_state.json"))
    extras = torch.load(os.path.join(folder, "extras.pt"), map_location="cpu", weights_only=True)
    keep = ("trainer_state.json",) if weights_only else None
    files = {rel: _as_tensor(_read(folder, rel)) for rel in sorted(marker.get(integrity.FILES, {}))
             if rel != MODEL_OPTIM and (keep is None or rel in keep or rel.startswith("hparams"))}
    resume = {"marker": json.dumps({**marker, "weights_only": weights_only}), "files": files}
    if not weights_only:
        resume["optim"] = state.get("optim")
    checkpoint: dict[str, Any] = {
        "epoch": int(progress.get("epoch", 0)), "global_step": int(progress.get("global_step", progress["step"])),
        "pytorch-lightning_version": LIGHTNING_VERSION, "state_dict": state["model"], KEY: resume,
    }
    if hparams:
        checkpoint["hyper_parameters"] = hparams
    if not weights_only:
        callbacks = {k: v for k, v in (extras.get("callbacks") or {}).items() if not k.startswith("__")}
        checkpoint.update(callbacks=callbacks, lr_schedulers=_schedulers(extras.get("scheduler")),
                          optimizer_states=optimizer_states if optimizer_states is not None else [state.get("optim")])
    write_atomic(checkpoint, path)


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
    for rel, data in resume["files"].items():
        os.makedirs(os.path.dirname(os.path.join(folder, rel)), exist_ok=True)
        with open(os.path.join(folder, rel), "wb") as handle:
            handle.write(data.numpy().tobytes())
    state = {"model": loaded["state_dict"]}
    if "optim" in resume:
        state["optim"] = resume["optim"]
    torch.save(state, os.path.join(folder, MODEL_OPTIM))
    # the file's own integrity is torch.load's to check; the folder rebuilt from it is complete
    recorded = marker.get(integrity.FILES)
    if recorded is not None:
        marker[integrity.FILES] = {rel: size for rel, size in recorded.items() if rel in resume["files"]}
    marker["packed_from"] = path
    with open(os.path.join(folder, layout.COMMITTED), "w", encoding="utf-8") as handle:
        json.dump(marker, handle)
    _unpacked[key] = folder
    return folder


def folder_of(path: str) -> str:
    """``path``, or the folder it holds when it is a packed file."""
    return unpacked(path) if is_packed(path) else path
