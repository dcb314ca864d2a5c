"""Lightning's ``ModelCheckpoint`` and default checkpointing, as this trainer's checkpoint settings.

``Trainer(callbacks=[ModelCheckpoint(monitor="val_loss", save_top_k=2)])`` becomes a
`CheckpointConfig` (the same machinery as ``checkpoint=``): the
saves are the trainer's checkpoint directories (``<dirpath>/step-<n>/``, loadable with
``Module.load_from_checkpoint(path)`` and ``ckpt_path=``), and ``best_model_path`` and the other
results are read from what is on disk, so they hold in the caller also after workers trained.

When the user configures nothing (no ``checkpoint=``, no ModelCheckpoint, ``enable_checkpointing``
not False), the trainer checkpoints as Lightning's default ModelCheckpoint does: at every epoch end
(and at the end of training), keeping the newest (`default_checkpointing`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from trainer.api.callback import Callback
from trainer.api.errors import MisconfigurationException
from trainer.checkpoint import layout
from trainer.checkpoint.config import CheckpointConfig

log = logging.getLogger(__name__)


class ModelCheckpoint(Callback):
    """Lightning's ModelCheckpoint with Lightning's meaning, mapped onto ``CheckpointConfig``.

    Args:
        dirpath: where checkpoints go (None: ``<run_dir>/checkpoints``; ``~`` is the home directory).
        filename: accepted with a warning: checkpoints here are folders named ``step-<n>``.
        monitor: the logged metric that ranks checkpoints (None: none is ranked).
        mode: "min" (the lowest ``monitor`` is best) or "max".
        save_top_k: with ``monitor``, keep the k best (-1: all; 0: no periodic saves); without,
            1 keeps the newest, -1 all, 0 none (as Lightning, other values need ``monitor``).
        save_last: ``last_model_path`` names the newest checkpoint (the newest is always kept
            here: a resume needs it).
        every_n_epochs: save every n epoch ends (None: 1 unless ``every_n_train_steps`` is given; 0: never).
        every_n_train_steps: save every n optimizer steps (``global_step``).
        save_weights_only: accepted with a warning: checkpoints here always hold the whole training state.
        verbose: accepted and kept as the ``verbose`` attribute; it changes nothing here.
        auto_insert_metric_name: accepted, with no effect (names of files here are fixed).
        enable_version_counter: accepted, with no effect (names of files here are fixed).
        train_time_interval: refused (give ``every_n_train_steps`` or ``every_n_epochs``).
        save_on_train_epoch_end: None, or accepted with a warning: epoch-end saves come after
            the epoch's validation.

    After (or during) a run: ``best_model_path``, ``best_model_score`` (a tensor), ``best_k_models``,
    ``kth_best_model_path``, ``last_model_path``, ``dirpath``. Under Lightning's default checkpointing
    the Trainer's ``checkpoint_callback`` is such an object too.
    """

    def __init__(self, dirpath: Any = None, filename: str | None = None, monitor: str | None = None,
                 verbose: bool = False, save_last: bool | str | None = None, save_top_k: int = 1,
                 save_weights_only: bool = False, mode: str = "min", auto_insert_metric_name: bool = True,
                 every_n_train_steps: int | None = None, train_time_interval: Any = None,
                 every_n_epochs: int | None = None, save_on_train_epoch_end: bool | None = None,
                 enable_version_counter: bool = True):
        if train_time_interval is not None:
            raise ValueError(f"ModelCheckpoint(train_time_interval={train_time_interval!r}) is not supported; "
                             "give every_n_train_steps= or every_n_epochs=")
        if mode not in ("min", "max"):
            raise ValueError(f"ModelCheckpoint(mode={mode!r}): give 'min' or 'max'")
        if not isinstance(save_top_k, int) or isinstance(save_top_k, bool) or save_top_k < -1:
            raise ValueError(f"ModelCheckpoint(save_top_k={save_top_k!r}) must be an integer >= -1")
        if monitor is None and save_top_k not in (-1, 0, 1):
            raise ValueError(f"ModelCheckpoint(save_top_k={save_top_k}, monitor=None): with more than one kept "
                             "checkpoint a monitor= ranks them; give monitor= or save_top_k in (-1, 0, 1)")
        if save_last not in (None, True, False, "link"):
            raise ValueError(f"ModelCheckpoint(save_last={save_last!r}): give None, True, False or 'link'")
        for name, value in (("every_n_train_steps", every_n_train_steps), ("every_n_epochs", every_n_epochs)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"ModelCheckpoint({name}={value!r}) must be None or an integer >= 0")
        notes = []
        if filename is not None:
            notes.append(f"filename={filename!r} (checkpoints here are folders named step-<n>)")
        if save_weights_only:
            notes.append("save_weights_only=True (checkpoints here hold the whole training state)")
        if save_on_train_epoch_end is not None:
            notes.append(f"save_on_train_epoch_end={save_on_train_epoch_end} (epoch-end saves come after the "
                         "epoch's validation)")
        if notes:
            log.warning("ModelCheckpoint: ignoring %s", "; ".join(notes))
        if every_n_train_steps is None and every_n_epochs is None:
            every_n_epochs = 1  # Lightning's default trigger
        self.dirpath_given = os.path.expanduser(os.fspath(dirpath)) if dirpath is not None else None  # "~/..." as Lightning
        self.filename, self.verbose = filename, verbose
        self.monitor, self.mode, self.save_top_k, self.save_last = monitor, mode, save_top_k, save_last
        self.every_n_epochs, self.every_n_train_steps = every_n_epochs or None, every_n_train_steps or None
        self._trainer: Any = None  # the Trainer this belongs to: its run directory locates the checkpoints

    def writes_files(self, format: str) -> bool:
        """Whether this callback saves its own checkpoint files (Lightning's mirror, with the full
        ``format``) instead of setting the trainer's checkpointing (folders ``step-<n>/``)."""
        return False

    def checkpoint_config(self, format: str) -> CheckpointConfig | None:
        """The trainer's checkpoint settings for this ModelCheckpoint (None: it saves nothing)."""
        periodic = self.save_top_k != 0
        every_steps = self.every_n_train_steps if periodic else None
        every_epochs = (self.every_n_epochs or None) if periodic else None
        # Lightning's epoch trigger also fires when training ends mid-epoch: save at the end then too.
        at_end = bool(self.save_last) or (periodic and every_epochs is not None)
        if not (every_steps or every_epochs or at_end):
            return None
        if self.monitor is not None:
            keep_last, keep_best = (None, 0) if self.save_top_k == -1 else (0, self.save_top_k)
        else:
            keep_last, keep_best = (None if self.save_top_k == -1 else 1), 0
        config = CheckpointConfig(dir=self.dirpath_given, every_n_steps=every_steps, every_n_epochs=every_epochs,
                                  save_last=at_end, format=format, keep_last=keep_last, monitor=self.monitor,
                                  mode=self.mode, keep_best=keep_best, save_on_signal=False)
        config.best_is_latest_without_monitor = True  # Lightning's ckpt_path="best" with no monitor
        return config

    # ----- Lightning's results, read from the checkpoints on disk ------------------------------------------
    @property
    def dirpath(self) -> str | None:
        """The folder the checkpoints go to (None before the Trainer is built)."""
        if self.dirpath_given is not None:
            return os.path.abspath(self.dirpath_given)
        if self._trainer is None:
            return None
        return os.path.abspath(os.path.join(self._trainer.run_dir, "checkpoints"))

    def _scored(self) -> list[tuple[float, str]]:
        found = layout.committed_checkpoints(self.dirpath) if self.dirpath else []
        scored = [(layout.read_marker(path).get("metrics", {}).get(self.monitor), path) for path in found]
        return sorted(((v, p) for v, p in scored if v is not None), key=lambda item: item[0],
                      reverse=self.mode == "max")

    @property
    def best_k_models(self) -> dict[str, Any]:
        """{checkpoint path: its monitored value (a tensor)} of the checkpoints kept as the best."""
        import torch

        if self.monitor is None:
            return {}
        scored = self._scored()
        kept = scored if self.save_top_k == -1 else scored[:self.save_top_k]  # (the newest is kept besides them)
        return {path: torch.tensor(value) for value, path in kept}

    @property
    def best_model_path(self) -> str:
        """The best checkpoint by ``monitor`` (without one: the newest); "" before any save."""
        if self.monitor is None:
            return self.last_saved_path
        scored = self._scored()
        return scored[0][1] if scored else ""

    @property
    def best_model_score(self) -> Any:
        """The monitored value of ``best_model_path`` (a tensor; None without monitor or save)."""
        import torch

        scored = self._scored() if self.monitor is not None else []
        return torch.tensor(scored[0][0]) if scored else None

    @property
    def kth_best_model_path(self) -> str:
        """The worst of the kept best checkpoints ("" without monitor or save)."""
        kept = list(self.best_k_models)
        return kept[-1] if kept else ""

    @property
    def last_saved_path(self) -> str:
        """The newest complete checkpoint ("" before any save)."""
        latest = layout.find_latest(self.dirpath) if self.dirpath else None
        return latest or ""

    @property
    def last_model_path(self) -> str:
        """With ``save_last``: the newest checkpoint; else "" (as Lightning)."""
        return self.last_saved_path if self.save_last else ""


def default_checkpointing(format: str) -> tuple[CheckpointConfig, ModelCheckpoint]:
    """Lightning's default: a checkpoint at every epoch end (and at the end of training), the newest kept."""
    callback = ModelCheckpoint()
    return callback.checkpoint_config(format), callback


def checkpointing(checkpoint: Any, enable_checkpointing: bool | None, callbacks: list, formats: tuple[str, ...],
                  configured: bool, default: type | None = None) -> tuple[Any, ModelCheckpoint | None]:
    """(the ``checkpoint=`` value to use, the Trainer's ``checkpoint_callback``) from the Trainer's
    ``checkpoint`` (``configured``: given), ``enable_checkpointing`` and the ModelCheckpoints among
    ``callbacks``; ``formats``: the strategy's checkpoint formats ("full" when it has it);
    ``default``: the ModelCheckpoint class of the default checkpointing (one that writes its own
    files is added to ``callbacks``)."""
    if enable_checkpointing not in (None, True, False):
        raise TypeError(f"Trainer(enable_checkpointing={enable_checkpointing!r}) must be True or False")
    format = "full" if "full" in formats else formats[0]
    given = [callback for callback in callbacks if isinstance(callback, ModelCheckpoint)]
    writers = [callback for callback in given if callback.writes_files(format)]
    if writers and len(writers) < len(given):
        raise ValueError("Lightning's ModelCheckpoint (trainer.lightning) and this trainer's ModelCheckpoint together: "
                         "use one kind")
    if writers and enable_checkpointing is False:
        raise MisconfigurationException("Trainer was configured with `enable_checkpointing=False` but found "
                                        "`ModelCheckpoint` in callbacks list: remove one of them")
    if writers and configured:
        raise ValueError("Trainer(checkpoint=..., callbacks=[ModelCheckpoint(...)]): both set the checkpointing; "
                         "give one of them")
    if writers:
        callbacks[:] = [c for c in callbacks if c not in writers] + writers  # last, as Lightning orders them
        return None, writers[0]
    if len(given) > 1:
        raise ValueError(f"{len(given)} ModelCheckpoint callbacks: one is supported here (it sets the trainer's "
                         "checkpointing); keep one")
    if given and configured:
        raise ValueError("Trainer(checkpoint=..., callbacks=[ModelCheckpoint(...)]): both set the checkpointing; "
                         "give one of them")
    if given and enable_checkpointing is False:
        raise ValueError("Trainer(enable_checkpointing=False) with a ModelCheckpoint callback: remove one of them")
    if configured and enable_checkpointing is not None and (checkpoint is None) == enable_checkpointing:
        raise ValueError(f"Trainer(checkpoint={checkpoint!r}, enable_checkpointing={enable_checkpointing}) "
                         "disagree; give one of them")
    if given:
        return given[0].checkpoint_config(format), given[0]
    if configured:
        return checkpoint, None
    if enable_checkpointing is False:
        return None, None
    if default is not None and (writer := default()).writes_files(format):
        callbacks.append(writer)
        return None, writer
    config, callback = default_checkpointing(format)
    return config, callback


class _Unset:
    """The default of ``Trainer(checkpoint=...)``: nothing configured (Lightning's default checkpointing)."""

    def __repr__(self) -> str:
        return "<Lightning's default: every epoch end, the newest kept>"


CHECKPOINT_DEFAULT = _Unset()
