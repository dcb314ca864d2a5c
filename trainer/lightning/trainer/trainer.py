"""Lightning's ``Trainer``: this trainer with Lightning's defaults where ours differ, so that a program
that leaves them unset trains as long, validates as often and logs as often as under Lightning:

- ``max_epochs``: as Lightning reads it: ``trainer.max_epochs`` is what was given (None) until
  ``fit`` sets it, then 1000 when neither it nor ``max_steps`` was given (ours: 1), -1 (no epoch
  limit) when only ``max_steps`` was; ``max_epochs=-1``: no epoch limit; ``max_epochs=0``: ``fit``
  trains nothing (its set-up still runs: ``configure_optimizers`` is checked);
- ``check_val_every_n_epoch``: 1, validation at every epoch end (ours: only at the end of training),
  and no validation at the end of fit beyond that schedule; a ``val_check_interval`` given with it
  counts the steps of each epoch, and the epoch's end validates only where that count falls
  (``trainer/loop/val_schedule.py``);
- what ``validation_step`` / ``test_step`` return is not turned into ``val/`` / ``test/`` metrics (only
  ``self.log`` logs, as Lightning);
- the loggers, ``trainer.logged_metrics`` and ``trainer.callback_metrics`` hold what the module and the
  callbacks logged, the loggers' rows with ``"epoch"`` and at Lightning's steps, not this trainer's own
  values (``train/loss``, ``perf/...``: they stay in ``metrics.jsonl``; ``trainer/loop/logged_rows.py``);
  after a call the two dicts hold tensors, as Lightning's (``properties.py``);
- ``log_every_n_steps``: 50 (ours: 10);
- ``seed``: the one ``seed_everything`` set (``PL_GLOBAL_SEED``), else 0: it seeds the sample order
  and the workers as the Trainer's seed does;
- ``trainer.progress_bar_callback``: a ``TQDMProgressBar`` unless ``enable_progress_bar=False``, and
  ``trainer.progress_bar_metrics`` (``progress.py``); the bar is drawn when stderr is a terminal;
- ``default_root_dir``: the working directory; ``logger``: Lightning's default logger list, and
  ``trainer.log_dir`` as Lightning's, with this trainer's ``metrics.jsonl`` beside the loggers' files
  but not among ``trainer.loggers``; ``PL_TRAINER_<ARGUMENT>`` environment variables (``loggers.py``);

``reload_dataloaders_every_n_epochs=N``: the data hooks are called again every N epochs
(``trainer/loop/data_reload.py``); ``barebones=True`` and the INFO lines about limits of one batch (``flags.py``); Lightning's return
shapes: ``validate`` / ``test`` return a list with one dict of metrics per loader, ``fit`` returns
None; and Lightning's answer to a
KeyboardInterrupt during a call: the run shuts down (``on_exception`` hooks, loggers finalized with
"failed", ``trainer.state.status == "interrupted"``), then ``SystemExit(1)``.

Everything else, and every argument given, is `trainer.Trainer`'s (keyword arguments, as
Lightning's ``Trainer``)."""

from __future__ import annotations

import re

import os
from typing import Any, Callable

from trainer.lightning.accelerators import cuda
from trainer.lightning.callbacks.model_checkpoint import ModelCheckpoint
from trainer.lightning.trainer.clipping import LightningClipSetting
from trainer.lightning.trainer.flags import announce_limits, apply_barebones, check_val_interval, reload_epochs
from trainer.lightning.trainer.loader_properties import LoaderProperties
from trainer.lightning.trainer.progress import ProgressBarProperties
from trainer.lightning.trainer.loggers import (LightningLoggers, trainer_arguments, with_environment_arguments,
                                               with_lightning_logging)
from trainer.lightning.trainer.properties import LightningRunProperties
from trainer.lightning.utilities.rank_zero import rank_zero_info

from trainer.trainer import Trainer as _Trainer

#: what Lightning's Trainer does where its argument is not given, and ours does otherwise
LIGHTNING_DEFAULTS = {"check_val_every_n_epoch": 1, "log_every_n_steps": 50, "strategy": "auto"}


class Trainer(LoaderProperties, LightningClipSetting, LightningLoggers, LightningRunProperties, ProgressBarProperties,
              _Trainer):
    """`trainer.Trainer` with Lightning's defaults (see the module docstring)."""

    default_checkpoint_class = ModelCheckpoint  # Lightning's checkpoint files (full checkpoints)
    write_flops_file = False  # Lightning writes nothing of its own into default_root_dir
    lightning_rows = True  # the loggers get what was logged, as Lightning numbers and fills rows (logged_rows.py)
    #: fit(ckpt_path=) from a checkpoint past max_epochs: Lightning's MisconfigurationException (trainer.Trainer:
    #: a warning, nothing trained)
    refuses_resume_past_max_epochs = True

    @staticmethod
    def cuda_device_count() -> int:
        """Lightning's reading: ``trainer.lightning.accelerators.cuda.num_cuda_devices()`` (patched there, seen here)."""
        return cuda.num_cuda_devices()

    def __init__(self, **kwargs: Any):
        kwargs = with_environment_arguments(kwargs, trainer_arguments(_Trainer) + ["barebones"])  # PL_TRAINER_*
        self.barebones = bool(kwargs.get("barebones", False))
        kwargs = apply_barebones(kwargs)  # Lightning's Trainer(barebones=True) (flags.py)
        announce_limits(kwargs)
        #: Lightning's ``reload_dataloaders_every_n_epochs`` (0: the data hooks run once per call;
        #: trainer/loop/data_reload.py)
        self.reload_dataloaders_every_n_epochs = reload_epochs(kwargs.pop("reload_dataloaders_every_n_epochs", 0))
        check_val_interval(kwargs)
        #: the arguments set to Lightning's default because they were not given (not warned about as settings)
        self.lightning_defaults = frozenset(name for name in LIGHTNING_DEFAULTS if name not in kwargs)
        for name, value in LIGHTNING_DEFAULTS.items():
            kwargs.setdefault(name, value)
        given_epochs = kwargs.get("max_epochs")
        if given_epochs is not None and (not isinstance(given_epochs, int) or isinstance(given_epochs, bool)
                                         or given_epochs < -1):
            raise ValueError(f"Trainer(max_epochs={given_epochs!r}): give None, -1 (no epoch limit) or an integer >= 0")
        if given_epochs is not None and given_epochs < 1:  # (set on the Trainer below: the core takes >= 1)
            kwargs["max_epochs"] = None
        if kwargs.get("seed") is None:
            kwargs["seed"] = int(os.environ.get("PL_GLOBAL_SEED", 0))
        # (in a function: jsonargparse reads a kwargs key used here as an untyped argument of this __init__)
        kwargs = with_lightning_logging(kwargs)  # default_root_dir, Lightning's default logger (loggers.py)
        super().__init__(**kwargs)
        self._choose_progress_bar()  # trainer.progress_bar_callback (progress.py)
        if not self.fast_dev_run:  # (fast_dev_run: one epoch, as Lightning)
            self.max_epochs = given_epochs  # Lightning's reading: None until fit resolves it (`fit`)
        #: Lightning validates when its schedule says (val_check_interval, check_val_every_n_epoch), never
        #: again at the end of fit as this trainer does
        self.validates_at_fit_end = False
        #: and counts val_check_interval within each epoch when check_val_every_n_epoch is set, an epoch's
        #: end validating only where that count falls (trainer/loop/val_schedule.py)
        self.lightning_val_schedule = True
        #: Lightning's warnings about a run's data and settings are Python warnings (UserWarning), as
        #: Lightning gives them, including its own (an epoch shorter than log_every_n_steps)
        self.lightning_warnings = True
        #: what validation_step / test_step return is the program's (Lightning logs only what self.log
        #: gives); this trainer's own Trainer also reduces returned losses and dicts into val/ and test/ metrics
        self.reduces_eval_outputs = False
        if self.fast_dev_run == 1:
            self.fast_dev_run = True  # (Lightning's reading of fast_dev_run=1)

    @property
    def num_devices(self) -> int:
        """Processes per node (Lightning's name for ``devices``)."""
        return self.devices

    @property
    def node_rank(self) -> int:
        """This process's machine: its global rank over the processes per node (0 on one machine)."""
        return self.global_rank // max(int(self.num_devices), 1)

    @property
    def default_root_dir(self) -> str:
        """Where logs and checkpoints go (this trainer's run directory)."""
        return self.run_dir

    def fit(self, *args: Any, **kwargs: Any) -> None:
        """`trainer.Trainer.fit`, returning None as Lightning's does (the metrics: ``trainer.callback_metrics``)."""
        if self.max_epochs is None:  # Lightning's default limits: 1000 epochs, or max_steps alone
            self.max_epochs = 1000 if self.max_steps in (-1, None) else -1
        _exit_on_interrupt(lambda: super(Trainer, self).fit(*args, **self._files_named(kwargs)))

    def validate(self, *args: Any, **kwargs: Any) -> list[dict[str, float]] | None:
        """`trainer.Trainer.validate`'s metrics as Lightning returns them: ``[metrics]``."""
        return _as_list(_exit_on_interrupt(lambda: super(Trainer, self).validate(*args, **self._files_named(kwargs))),
                        self.__dict__.get("_metric_loaders", {}), skipped=self.limit_val_batches == 0)

    def test(self, *args: Any, **kwargs: Any) -> list[dict[str, float]] | None:
        """`trainer.Trainer.test`'s metrics as Lightning returns them: ``[metrics]``."""
        return _as_list(_exit_on_interrupt(lambda: super(Trainer, self).test(*args, **self._files_named(kwargs))),
                        self.__dict__.get("_metric_loaders", {}), skipped=self.limit_test_batches == 0)

    def predict(self, *args: Any, **kwargs: Any) -> Any:
        """`trainer.Trainer.predict` (a KeyboardInterrupt exits as under Lightning)."""
        return _exit_on_interrupt(lambda: super(Trainer, self).predict(*args, **self._files_named(kwargs)))


    def _files_named(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``ckpt_path="best"`` / ``"last"`` as the file a ModelCheckpoint writing files saved (as Lightning)."""
        writers = [callback for callback in self.checkpoint_callbacks if callback.__dict__.get("_files")]
        name = kwargs.get("ckpt_path")
        if not writers or name not in ("best", "last"):
            return kwargs
        if name == "best":
            path = writers[0].best_model_path
            if not path:
                raise ValueError('ckpt_path="best": the ModelCheckpoint has no best checkpoint yet (it saved none, or '
                                 'has no monitor and save_top_k=0); give a checkpoint path')
        else:
            saved = [p for w in writers for p in (w.last_model_path, w._last_checkpoint_saved) if p and os.path.exists(p)]
            if not saved:  # as Lightning: nothing saved yet, the call starts from scratch
                rank_zero_info('ckpt_path="last": no checkpoint saved yet, none is loaded')
                return {**kwargs, "ckpt_path": None}
            path = max(saved, key=os.path.getmtime)
        return {**kwargs, "ckpt_path": path}


def _exit_on_interrupt(call: Callable[[], Any]) -> Any:
    """``call()``; a KeyboardInterrupt during it (the run already shut down: the on_exception hooks ran,
    the loggers were finalized with "failed") becomes Lightning's ``SystemExit(1)``."""
    try:
        return call()
    except KeyboardInterrupt as interrupt:
        rank_zero_info("Detected KeyboardInterrupt, attempting graceful shutdown ...")
        raise SystemExit(1) from interrupt


def _as_list(metrics: dict[str, float] | None, loader_of: dict[str, int] | None = None,
             skipped: bool = False) -> list[dict[str, float]] | None:
    """Lightning's list of one metrics dict per loader (with several loaders, loader N's dict holds the
    names ending in ``/dataloader_idx_N``, those logged in loader N's batches alone (``loader_of``, e.g.
    with ``add_dataloader_idx=False``) and those of none); ``[]`` for a pass a zero limit skipped."""
    if metrics is None:
        return None
    if skipped:
        return []
    owner = {name: int(match.group(1)) for name in metrics if (match := re.search(r"/dataloader_idx_(\d+)$", name))}
    for logged, index in (loader_of or {}).items():  # (a name logged on_step and on_epoch: name_epoch)
        owner.update({name: index for name in (logged, logged + "_epoch") if name in metrics and name not in owner})
    if not owner:
        return [metrics]
    return [{name: value for name, value in metrics.items() if owner.get(name, index) == index}
            for index in range(max(owner.values()) + 1)]
