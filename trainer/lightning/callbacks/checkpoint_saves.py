"""When Lightning's ModelCheckpoint saves and which files it keeps (a mixin of the mirror's
``ModelCheckpoint``; every save is ``trainer.save_checkpoint(path, save_weights_only)``)."""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any

import torch

from trainer.api.callback import run_of
from trainer.api.errors import MisconfigurationException
from trainer.runtime import distributed

log = logging.getLogger(__name__)


class CheckpointSaves:
    """The hooks and the top-k bookkeeping of Lightning's ModelCheckpoint."""

    # ----- hooks ---------------------------------------------------------------------------------------
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self._files:
            return
        every = self._every_n_train_steps
        skip_batch = every < 1 or trainer.global_step % every != 0
        skip_time, now = True, self._now()
        if self._train_time_interval is not None:
            previous = self._last_time_checked
            skip_time = previous is None or now - previous < self._train_time_interval.total_seconds()
            skip_time = distributed.broadcast_object(skip_time)  # rank 0's clock decides for every rank
        if skip_batch and skip_time:
            return
        if not skip_time:
            self._last_time_checked = now
        candidates = self._monitor_candidates(trainer)
        if self.monitor is not None and self.monitor not in candidates:
            self._defer_save_until_validation = True  # a metric of validation: saved once it is logged
            return
        if self._should_skip_saving_checkpoint(trainer):
            return
        self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._open_epoch = trainer.current_epoch

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self._open_epoch = None
        if self._files and not self._should_skip_saving_checkpoint(trainer) \
                and self._should_save_on_train_epoch_end(trainer):
            self._epoch_save(trainer)

    def on_validation_end(self, trainer: Any, pl_module: Any, *metrics: Any) -> None:
        if not self._files or trainer.sanity_checking:
            return
        self._validated = True
        if self._should_skip_saving_checkpoint(trainer) or self._should_save_on_train_epoch_end(trainer):
            return
        if self._defer_save_until_validation:
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)
            self._defer_save_until_validation = False
            return
        self._epoch_save(trainer)

    def _epoch_save(self, trainer: Any) -> None:
        candidates = self._monitor_candidates(trainer)
        if self._every_n_epochs >= 1 and (trainer.current_epoch + 1) % self._every_n_epochs == 0:
            self._save_topk_checkpoint(trainer, candidates)
        if self._last_global_step_saved == trainer.global_step or (self.save_last == "link"
                                                                   and self._last_checkpoint_saved):
            self._save_last_checkpoint(trainer, candidates)

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if not (self._files and self.save_on_exception) or trainer.fast_dev_run or trainer.sanity_checking \
                or self._last_global_step_saved == trainer.global_step:
            return
        if distributed.world_size() > 1:  # a save is a collective, and the other ranks may be elsewhere
            log.warning("ModelCheckpoint(save_on_exception=True): no checkpoint saved after %s on rank %d of %d (a "
                        "save needs every rank); the newest checkpoint is %s", type(exception).__name__,
                        distributed.rank(), distributed.world_size(), self._last_checkpoint_saved or "none")
            return
        candidates = self._monitor_candidates(trainer)
        path = self.format_checkpoint_name(candidates)
        self._save_checkpoint(trainer, path)
        self._save_last_checkpoint(trainer, candidates)
        log.info("%s was raised (%s): checkpoint saved to %s", type(exception).__name__, exception, path)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        epoch = self.__dict__.pop("_open_epoch", None)
        if self._files and epoch is not None and not self._should_skip_saving_checkpoint(trainer) \
                and self._should_save_on_train_epoch_end(trainer):
            # training stopped inside an epoch (max_steps): Lightning ends that epoch, saving as at its end
            candidates = self._monitor_candidates(trainer)
            if self._every_n_epochs >= 1 and (epoch + 1) % self._every_n_epochs == 0:
                self._save_topk_checkpoint(trainer, candidates)
            if self._last_global_step_saved == trainer.global_step:
                self._save_last_checkpoint(trainer, candidates)
        if self._files and self.save_last and not self._last_checkpoint_saved:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    # ----- when -------------------------------------------------------------------------------------------
    def _should_skip_saving_checkpoint(self, trainer: Any) -> bool:
        return bool(trainer.fast_dev_run) or trainer.state.fn != "fit" or trainer.sanity_checking \
            or self._last_global_step_saved == trainer.global_step

    def _should_save_on_train_epoch_end(self, trainer: Any) -> bool:
        if self._save_on_train_epoch_end is not None:
            return self._save_on_train_epoch_end
        if getattr(trainer, "check_val_every_n_epoch", 1) != 1:
            return False
        if not run_of(trainer).has_validation or trainer.limit_val_batches == 0:
            return True  # no validation: the epoch's end is where it saves
        return getattr(trainer, "val_every_n_steps", None) is None \
            and getattr(trainer, "val_check_fraction", None) in (None, 1, 1.0)

    def _monitor_candidates(self, trainer: Any) -> dict[str, torch.Tensor]:
        candidates = {name: value if isinstance(value, torch.Tensor) else torch.tensor(value)
                      for name, value in dict(trainer.callback_metrics).items()}
        epoch, step = candidates.get("epoch"), candidates.get("step")
        candidates["epoch"] = epoch.int() if epoch is not None else torch.tensor(trainer.current_epoch)
        candidates["step"] = step.int() if step is not None else torch.tensor(trainer.global_step)
        return candidates

    # ----- what ---------------------------------------------------------------------------------------------
    def _save_topk_checkpoint(self, trainer: Any, candidates: dict[str, torch.Tensor]) -> None:
        if self.save_top_k == 0:
            return
        if self.monitor is None:
            self._save_none_monitor_checkpoint(trainer, candidates)
            return
        if self.monitor not in candidates:
            message = (f"`ModelCheckpoint(monitor={self.monitor!r})` could not find the monitored key in the returned "
                       f"metrics: {sorted(candidates)}. HINT: Did you call `log({self.monitor!r}, value)` in the "
                       "`LightningModule`?")
            if self._validated:
                raise MisconfigurationException(message)
            log.warning(message)
        self._save_monitor_checkpoint(trainer, candidates)

    def _save_checkpoint(self, trainer: Any, filepath: str) -> None:
        self._last_global_step_saved = trainer.global_step  # (before: the file's own state says this step)
        trainer.save_checkpoint(filepath, self.save_weights_only)
        self._last_checkpoint_saved = filepath
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                if hasattr(logger, "after_save_checkpoint"):
                    logger.after_save_checkpoint(self)

    def _save_last_checkpoint(self, trainer: Any, candidates: dict[str, torch.Tensor]) -> None:
        if not self.save_last:
            return
        path = self._versioned(candidates, self.CHECKPOINT_NAME_LAST, self.last_model_path)
        previous, self.last_model_path = self.last_model_path, path
        if self.save_last == "link" and self._last_checkpoint_saved and self.save_top_k != 0:
            self._link_checkpoint(trainer, self._last_checkpoint_saved, path)
        else:
            self._save_checkpoint(trainer, path)
        if previous and self._should_remove_checkpoint(trainer, previous, path):
            self._remove_checkpoint(trainer, previous)

    def _save_none_monitor_checkpoint(self, trainer: Any, candidates: dict[str, torch.Tensor]) -> None:
        path = self._versioned(candidates, None, self.best_model_path)
        previous, self.best_model_path = self.best_model_path, path
        self._save_checkpoint(trainer, path)
        if self.save_top_k == 1 and previous and self._should_remove_checkpoint(trainer, previous, path):
            self._remove_checkpoint(trainer, previous)

    def check_monitor_top_k(self, trainer: Any, current: torch.Tensor | None = None) -> bool:
        """Whether a checkpoint scoring ``current`` belongs among the ``save_top_k`` best."""
        if current is None:
            return False
        if self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k:
            return True
        better = torch.lt if self.mode == "min" else torch.gt
        return bool(better(current, self.best_k_models[self.kth_best_model_path]))

    def _save_monitor_checkpoint(self, trainer: Any, candidates: dict[str, torch.Tensor]) -> None:
        current = candidates.get(self.monitor)
        if self.check_monitor_top_k(trainer, current):
            self._update_best_and_save(current, trainer, candidates)
        elif self.verbose:
            log.info("Epoch %d, global step %d: %r was not in top %d", int(candidates["epoch"]),
                     int(candidates["step"]), self.monitor, self.save_top_k)

    def _update_best_and_save(self, current: torch.Tensor, trainer: Any, candidates: dict[str, torch.Tensor]) -> None:
        k = len(self.best_k_models) + 1 if self.save_top_k == -1 else self.save_top_k
        dropped = None
        if len(self.best_k_models) == k and k > 0:
            dropped = self.kth_best_model_path
            self.best_k_models.pop(dropped)
        if isinstance(current, torch.Tensor) and torch.isnan(current):  # NaN ranks worst
            current = torch.tensor(float("inf" if self.mode == "min" else "-inf"), device=current.device)
        path = self._versioned(candidates, None, dropped)
        self.current_score = current
        self.best_k_models[path] = current
        if len(self.best_k_models) == k:
            worst = max if self.mode == "min" else min
            self.kth_best_model_path = worst(self.best_k_models, key=self.best_k_models.get)
            self.kth_value = self.best_k_models[self.kth_best_model_path]
        best = min if self.mode == "min" else max
        self.best_model_path = best(self.best_k_models, key=self.best_k_models.get)
        self.best_model_score = self.best_k_models[self.best_model_path]
        if self.verbose:
            log.info("Epoch %d, global step %d: %r reached %.5f (best %.5f), saving model to %r as top %d",
                     int(candidates["epoch"]), int(candidates["step"]), self.monitor, float(current),
                     float(self.best_model_score), path, k)
        self._save_checkpoint(trainer, path)
        if dropped and self._should_remove_checkpoint(trainer, dropped, path):
            self._remove_checkpoint(trainer, dropped)

    # ----- removal -------------------------------------------------------------------------------------------
    def _should_remove_checkpoint(self, trainer: Any, previous: str, current: str) -> bool:
        """Not the file just written, not the one this fit resumed from, and only inside ``dirpath``."""
        if previous == current:
            return False
        previous = os.path.abspath(previous)
        resumed = getattr(trainer, "ckpt_path", None)
        if resumed not in (None, "last", "best") and os.path.abspath(resumed) == previous:
            return False
        return os.path.abspath(self.dirpath) in [os.path.dirname(previous)] + _parents(previous)

    def _remove_checkpoint(self, trainer: Any, filepath: str) -> None:
        if trainer.is_global_zero:
            if os.path.isdir(filepath) and not os.path.islink(filepath):
                shutil.rmtree(filepath, ignore_errors=True)
            elif os.path.lexists(filepath):
                os.remove(filepath)


def _parents(path: str) -> list[str]:
    found, folder = [], os.path.dirname(path)
    while folder and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
        found.append(folder)
    return found
