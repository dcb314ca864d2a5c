"""Lightning's ``lightning.pytorch.callbacks.model_checkpoint``: ``ModelCheckpoint`` writing Lightning's
checkpoint files.

With a strategy that can save a full checkpoint (one process, DDP, FSDP: consolidated on rank 0), each save is one file
``dirpath/<filename>.ckpt`` made by ``trainer.save_checkpoint`` (Lightning's keys, and what this
trainer resumes from exactly: `trainer.checkpoint.single_file`), named from the ``filename``
template, kept by ``save_top_k`` / ``monitor`` / ``mode``, with ``last.ckpt`` (``save_last``, also
as a link), ``save_weights_only``, ``save_on_exception``, ``every_n_epochs`` /
``every_n_train_steps`` / ``train_time_interval``; several ModelCheckpoints work side by side.

With a strategy that saves sharded checkpoints only (the pipeline strategy), the callback
sets the trainer's checkpointing instead (`trainer.callbacks.ModelCheckpoint`: folders
``step-<n>/``, the results read from them).
"""

import logging
import os
import time
import warnings
from datetime import timedelta
from typing import Any, Literal, Optional, Union

import torch

from trainer.api.errors import MisconfigurationException
from trainer.callbacks.model_checkpoint import ModelCheckpoint as _FolderCheckpoint
from trainer.checkpoint.config import CheckpointConfig
from trainer.lightning.callbacks.checkpoint_saves import CheckpointSaves
from trainer.lightning.callbacks.checkpoint_names import CheckpointNames
from trainer.runtime import distributed

log = logging.getLogger(__name__)

_RESULTS = ("best_model_path", "best_model_score", "best_k_models", "kth_best_model_path", "last_model_path")


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


def _result(name: str) -> property:
    """A result attribute: kept on the callback when it writes files, read from the folders otherwise."""
    folder_property = getattr(_FolderCheckpoint, name)

    def get(self: "ModelCheckpoint") -> Any:
        return self.__dict__["_results"][name] if self._files else folder_property.fget(self)

    def set_(self: "ModelCheckpoint", value: Any) -> None:
        self.__dict__["_results"][name] = value

    return property(get, set_, doc=folder_property.__doc__)


class ModelCheckpoint(CheckpointSaves, CheckpointNames, _FolderCheckpoint):
    """Lightning's ModelCheckpoint (its arguments and meaning; see the module docstring).

    After (or during) a run: ``best_model_path``, ``best_model_score``, ``best_k_models``,
    ``kth_best_model_path``, ``kth_value``, ``last_model_path``, ``current_score``, ``dirpath``;
    ``to_yaml()`` writes ``best_k_models``; ``format_checkpoint_name(metrics)`` names a file.
    """

    watches_metrics = True  # its on_train_epoch_end after the module's, and it comes last (Lightning's order)

    def __init__(self, dirpath: Optional[Union[str, os.PathLike]] = None, filename: Optional[str] = None,
                 monitor: Optional[str] = None, verbose: bool = False,
                 save_last: Optional[Union[bool, Literal["link"]]] = None, save_top_k: int = 1,
                 save_on_exception: bool = False, save_weights_only: bool = False, mode: str = "min",
                 auto_insert_metric_name: bool = True, every_n_train_steps: Optional[int] = None,
                 train_time_interval: Optional[timedelta] = None, every_n_epochs: Optional[int] = None,
                 save_on_train_epoch_end: Optional[bool] = None, enable_version_counter: bool = True):
        if mode not in ("min", "max"):
            raise MisconfigurationException(f"ModelCheckpoint(mode={mode!r}): `mode` can be min, max but got {mode}")
        if save_last not in (None, True, False, "link"):
            raise MisconfigurationException(f"ModelCheckpoint(save_last={save_last!r}): give None, True, False or 'link'")
        self.__dict__["_results"] = {"best_model_path": "", "best_model_score": None, "best_k_models": {},
                                     "kth_best_model_path": "", "last_model_path": ""}
        self._files = True  # until the Trainer's strategy says it saves sharded checkpoints only
        self.monitor, self.verbose, self.save_last, self.save_top_k = monitor, verbose, save_last, save_top_k
        self.save_on_exception, self.save_weights_only, self.mode = save_on_exception, save_weights_only, mode
        self.auto_insert_metric_name, self.filename = auto_insert_metric_name, filename
        self._save_on_train_epoch_end, self._enable_version_counter = save_on_train_epoch_end, enable_version_counter
        self.kth_value = torch.tensor(float("inf") if mode == "min" else float("-inf"))
        self.current_score: Any = None
        self._last_global_step_saved = 0  # nothing to save before the first step
        self._last_checkpoint_saved = ""
        self._last_time_checked: float | None = None
        self._defer_save_until_validation = False
        self._validated = False
        given = os.fspath(dirpath) if dirpath else None
        if given and _is_local(given):
            given = os.path.realpath(os.path.expanduser(given))
        self._dirpath = self.dirpath_given = given
        if every_n_train_steps is None and every_n_epochs is None and train_time_interval is None:
            every_n_epochs, every_n_train_steps = 1, 0
        self._every_n_epochs, self._every_n_train_steps = every_n_epochs or 0, every_n_train_steps or 0
        self._train_time_interval = train_time_interval
        self.every_n_train_steps = self._every_n_train_steps or None  # the folder layout's setting
        self._trainer: Any = None
        self._check()

    def _check(self) -> None:
        if self.save_top_k < -1:
            raise MisconfigurationException(f"Invalid value for save_top_k={self.save_top_k}. Must be >= -1")
        if self._every_n_train_steps < 0:
            raise MisconfigurationException(
                f"Invalid value for every_n_train_steps={self._every_n_train_steps}. Must be >= 0")
        if self._every_n_epochs < 0:
            raise MisconfigurationException(f"Invalid value for every_n_epochs={self._every_n_epochs}. Must be >= 0")
        triggers = (self._every_n_train_steps >= 1) + (self._every_n_epochs >= 1) + (self._train_time_interval is not None)
        if triggers > 1:
            raise MisconfigurationException(
                f"Combination of parameters every_n_train_steps={self._every_n_train_steps}, every_n_epochs="
                f"{self._every_n_epochs} and train_time_interval={self._train_time_interval} should be mutually exclusive.")
        if self.monitor is None and self.save_top_k not in (-1, 0, 1):
            raise MisconfigurationException(
                f"ModelCheckpoint(save_top_k={self.save_top_k}, monitor=None) is not a valid configuration. No "
                "quantity for top_k to track.")

    best_model_path = _result("best_model_path")
    best_model_score = _result("best_model_score")
    best_k_models = _result("best_k_models")
    kth_best_model_path = _result("kth_best_model_path")
    last_model_path = _result("last_model_path")

    @property
    def dirpath(self) -> str | None:
        """The folder the checkpoint files go to (resolved when the Trainer sets up; None before)."""
        return self._dirpath if self._files else _FolderCheckpoint.dirpath.fget(self)

    @dirpath.setter
    def dirpath(self, value: Any) -> None:
        self._dirpath = os.fspath(value) if value is not None else None

    @property
    def every_n_epochs(self) -> int:
        """Save at every this many epoch ends (0: not by epochs)."""
        return self._every_n_epochs

    @property
    def state_key(self) -> str:
        """The key of this callback's state in a checkpoint (its settings: several can coexist)."""
        settings = {"monitor": self.monitor, "mode": self.mode, "every_n_train_steps": self._every_n_train_steps,
                    "every_n_epochs": self._every_n_epochs, "train_time_interval": self._train_time_interval}
        return f"{type(self).__qualname__}{settings!r}"

    # ----- which layout --------------------------------------------------------------------------------
    def writes_files(self, format: str) -> bool:
        """Files (Lightning's) with a strategy that has the full format; else the trainer's folders."""
        self._files = format == "full"
        return self._files

    def checkpoint_config(self, format: str) -> CheckpointConfig | None:
        """The folder layout's settings (a strategy that saves sharded checkpoints only)."""
        if self._train_time_interval is not None:
            raise ValueError(f"ModelCheckpoint(train_time_interval={self._train_time_interval!r}) with a strategy that "
                             "saves sharded checkpoints: give every_n_train_steps= or every_n_epochs=")
        ignored = [name for name in ("save_on_exception", "save_weights_only") if getattr(self, name)]
        if ignored or self.filename is not None:
            log.warning("ModelCheckpoint: %s not used: sharded checkpoints are folders named step-<n> holding the "
                        "whole training state", ", ".join(ignored + ["filename"] * (self.filename is not None)))
        return super().checkpoint_config(format)

    # ----- state -----------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The callback's results, as a checkpoint keeps them."""
        return self._state()

    def _state(self) -> dict[str, Any]:
        return {"monitor": self.monitor, "best_model_score": self.best_model_score,
                "best_model_path": self.best_model_path, "current_score": self.current_score,
                "dirpath": self.dirpath, "best_k_models": self.best_k_models,
                "kth_best_model_path": self.kth_best_model_path, "kth_value": self.kth_value,
                "last_model_path": self.last_model_path,
                # a resume that runs the epoch end of its checkpoint again does not save that step twice
                "last_global_step_saved": self._last_global_step_saved}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the results (the ranking only when the checkpoint's ``dirpath`` is this one's)."""
        if not self._files:
            return
        if state.get("dirpath", self.dirpath) == self.dirpath:
            self.best_model_score = state["best_model_score"]
            self.kth_best_model_path = state.get("kth_best_model_path", self.kth_best_model_path)
            self.kth_value = state.get("kth_value", self.kth_value)
            self.best_k_models = state.get("best_k_models", self.best_k_models)
            self.last_model_path = state.get("last_model_path", self.last_model_path)
            self._last_global_step_saved = state.get("last_global_step_saved", self._last_global_step_saved)
        else:
            warnings.warn(f"The dirpath has changed from {state.get('dirpath')!r} to {self.dirpath!r}: only "
                          "best_model_path is restored (not the ranking of the other folder's files)", UserWarning)
        self.best_model_path = state["best_model_path"]

    def results(self) -> dict[str, Any] | None:
        """What the caller of a spawned fit takes over (``adopt_results``): the files' results."""
        if not self._files:
            return None
        # (not through state_dict(): a subclass may count or change its calls, one per save)
        return {**self._state(), "last_checkpoint_saved": self._last_checkpoint_saved}

    def adopt_results(self, results: dict[str, Any] | None) -> None:
        """Take the results a spawned fit's rank 0 had (``best_model_path`` ... here as there)."""
        if results is None:
            return
        self._dirpath = results["dirpath"]
        self.load_state_dict(results)
        self.current_score = results["current_score"]
        self._last_checkpoint_saved = results["last_checkpoint_saved"]

    # ----- hooks -----------------------------------------------------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if not self._files:
            return
        self._dirpath = distributed.broadcast_object(self._resolve_dirpath(trainer))
        if self.save_last == "link" and not _is_local(self._dirpath):
            raise ValueError(f"`ModelCheckpoint(save_last='link')` is only supported for local file paths, got "
                             f"`dirpath={self._dirpath}`")
        self._trainer = trainer
        if stage == "fit" and trainer.is_global_zero and self.save_top_k != 0 and os.path.isdir(self._dirpath) \
                and os.listdir(self._dirpath):
            log.warning("Checkpoint directory %s exists and is not empty.", self._dirpath)

    def _resolve_dirpath(self, trainer: Any) -> str:
        """``dirpath``, else ``<logger's save_dir>/<name>/<version>/checkpoints``, else ``<root>/checkpoints``."""
        if self._dirpath is not None:
            return self._dirpath
        loggers = [logger for logger in getattr(trainer, "loggers", []) if hasattr(logger, "version")]
        root = getattr(trainer, "default_root_dir", None) or trainer.run_dir
        if loggers and getattr(loggers[0], "name", None) is not None:
            logger = loggers[0]
            version = logger.version if isinstance(logger.version, str) else f"version_{logger.version}"
            return os.path.join(getattr(logger, "save_dir", None) or root, str(logger.name), version, "checkpoints")
        return os.path.join(root, "checkpoints")

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._last_time_checked = self._now()

    @staticmethod
    def _now() -> float:
        """The clock of ``train_time_interval`` (this module's ``time.monotonic``)."""
        return time.monotonic()
