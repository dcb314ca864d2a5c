"""The objects among a run's hyperparameters, pickled for its checkpoints (``hparams.pt``).

A checkpoint's ``trainer_state.json`` holds the plain hyperparameters; the others (an ``nn.Module``
passed to ``__init__``, a ``functools.partial`` optimizer, a class, a tuple) would not come back
from JSON, so each is pickled on its own (``torch.save``) into ``hparams.pt``, which only
``load_from_checkpoint`` unpickles (resuming a run reads the checkpoint with ``weights_only=True``
and never opens it).

Each value is pickled when training starts, before the strategy wraps the model (FSDP changes the
classes of a model's layers in place: a layer pickled afterwards would not load in one process),
and again at a checkpoint only if the key then holds another object. A value that cannot be
pickled (a lambda, a class defined inside a function), or whose pickle holds the value of a
secret environment variable, is not stored: a warning names the key (once), and
``load_from_checkpoint`` asks for it.
"""

from __future__ import annotations

import io
import logging
from typing import Any

import torch

from trainer.api.hparams_display import checkpoint_record
from trainer.runtime.redact import secret_env_values

log = logging.getLogger(__name__)

#: The file in a checkpoint directory.
FILENAME = "hparams.pt"
#: A pickled hyperparameter this large is worth a word (a model passed to ``__init__``, with its weights).
LARGE_BYTES = 64 * 2**20
#: The part of the file (and of ``trainer_state.json``) each owner's hyperparameters go under.
PARTS = {"module": "hparams", "datamodule": "datamodule_hparams"}


def hparams_name(obj: Any) -> str | None:
    """The init argument ``obj``'s hyperparameters came in as one dict (``save_hyperparameters(config)``)."""
    return getattr(obj, "__dict__", {}).get("_hparams_name")


class HparamsArchive:
    """The pickled objects of a module's and a datamodule's hyperparameters (rank 0 of a fit that
    checkpoints). ``owners``: ``{"module": module, "datamodule": datamodule or None}``."""

    def __init__(self, owners: dict[str, Any]):
        self.owners = {part: obj for part, obj in owners.items() if obj is not None}
        self._pickled: dict[tuple[str, str], tuple[Any, bytes | None]] = {}  # (part, key) -> (value, its pickle)
        self.payload()  # now: before the strategy touches the model

    def payload(self) -> dict[str, dict[str, bytes]]:
        """``{part: {key: pickled value}}`` of the objects among the current hyperparameters
        (what ``hparams.pt`` holds); empty when there are none."""
        payload: dict[str, dict[str, bytes]] = {}
        for part, obj in self.owners.items():
            hparams = obj.hparams
            blobs = {}
            for key in checkpoint_record(hparams)["objects"]:
                value = hparams[key]
                cached = self._pickled.get((part, key))
                if cached is None or cached[0] is not value:
                    cached = (value, self._pickle(obj, key, value))
                    self._pickled[(part, key)] = cached
                if cached[1] is not None:
                    blobs[key] = cached[1]
            if blobs:
                payload[part] = blobs
        return payload

    @staticmethod
    def _pickle(obj: Any, key: str, value: Any) -> bytes | None:
        owner = type(obj).__name__
        buffer = io.BytesIO()
        try:
            torch.save(value, buffer)
        except Exception as error:
            log.warning("hyperparameter %r of %s (a %s) cannot be pickled (%s: %s): checkpoints keep it as text only, "
                        "and load_from_checkpoint will need %s=... passed; define it at module level (importable), or "
                        "leave it out with save_hyperparameters(ignore=[%r])", key, owner, type(value).__name__,
                        type(error).__name__, error, key, key)
            return None
        blob = buffer.getvalue()
        if any(secret.encode() in blob for secret in secret_env_values()):
            log.warning("hyperparameter %r of %s holds the value of a secret environment variable: checkpoints do not "
                        "store it, and load_from_checkpoint will need %s=... passed", key, owner, key)
            return None
        if len(blob) > LARGE_BYTES:
            log.warning("hyperparameter %r of %s takes %.0f MiB pickled (its weights as they were when training "
                        "started), written into every checkpoint's %s; save_hyperparameters(ignore=[%r]) and "
                        "load_from_checkpoint(path, %s=...) avoid that", key, owner, len(blob) / 2**20, FILENAME, key, key)
        return blob
