"""``SaveConfigCallback``: the configuration a `LightningCLI` run was parsed from, written as
``config.yaml`` into the run's log directory when the run sets up (rank 0), as Lightning's callback
writes it; ``save_config`` is the hook a subclass overrides to log it elsewhere (a logger)."""

from __future__ import annotations

import os
from typing import Any

from jsonargparse import ArgumentParser

from trainer.api.callback import Callback

#: keep the arguments whose value is None in the file (the option's name changed in jsonargparse 4.49)
_KEEP_NONE = {"skip_unset": False} if hasattr(ArgumentParser, "instantiate") else {"skip_none": False}


class SaveConfigCallback(Callback):
    """Write ``config`` (parsed by ``parser``) to ``trainer.log_dir / config_filename`` at ``setup``.

    Args:
        parser: the parser that parsed ``config`` (a `LightningArgumentParser`).
        config: the parsed configuration (a jsonargparse ``Namespace``).
        config_filename: the file's name in the log directory.
        overwrite: replace a file already there; False: a run whose log directory holds one stops
            with an error naming it (Lightning's check against overwriting another run's config).
        multifile: also write the nested configs given as their own files, each as its own file.
        save_to_log_dir: False: write nothing, only call `save_config` (then override it).
    """

    def __init__(self, parser: Any, config: Any, config_filename: str = "config.yaml", overwrite: bool = False,
                 multifile: bool = False, save_to_log_dir: bool = True) -> None:
        self.parser = parser
        self.config = config
        self.config_filename = config_filename
        self.overwrite = overwrite
        self.multifile = multifile
        self.save_to_log_dir = save_to_log_dir
        self.already_saved = False
        if not save_to_log_dir and type(self).save_config is SaveConfigCallback.save_config:
            raise ValueError("SaveConfigCallback(save_to_log_dir=False) writes nothing unless a subclass overrides "
                             "save_config(trainer, pl_module, stage); override it or keep save_to_log_dir=True")
        #: the configuration as yaml, made here: the callback travels to spawned ranks without its parser
        self.config_text = parser.dump(config, **_KEEP_NONE)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if not self.multifile:  # (the text says it all; a parser need not pickle)
            state["parser"] = None
        return state

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Write the file (rank 0; once per callback, the first of fit / validate / test / predict),
        then call `save_config` on rank 0."""
        if self.already_saved:
            return
        if self.save_to_log_dir:
            path = os.path.join(trainer.log_dir, self.config_filename)
            if trainer.is_global_zero and not self.overwrite and os.path.isfile(path) and not self._wrote(path):
                raise RuntimeError(
                    f"SaveConfigCallback: {path} exists already (another run's configuration?); give the run its own "
                    "directory (trainer.default_root_dir), or LightningCLI(save_config_kwargs={'overwrite': True}) "
                    "to replace it")
            if trainer.is_global_zero:
                os.makedirs(trainer.log_dir, exist_ok=True)
                self._write(path)
        if trainer.is_global_zero:
            self.save_config(trainer, pl_module, stage)
        self.already_saved = True

    def _wrote(self, path: str) -> bool:
        """Whether ``path`` holds this configuration already (this callback wrote it in an earlier call
        that ran on spawned ranks, where ``already_saved`` is not the caller's)."""
        with open(path, encoding="utf-8") as file:
            return file.read() == self.config_text

    def _write(self, path: str) -> None:
        if self.multifile:
            self.parser.save(self.config, path, overwrite=True, multifile=True, **_KEEP_NONE)
            return
        with open(path, "w", encoding="utf-8") as file:
            file.write(self.config_text)

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Override to do more with the configuration (``self.config``, ``self.config_text``) on rank 0,
        e.g. ``trainer.logger.log_hyperparams(...)``; the default does nothing more."""
