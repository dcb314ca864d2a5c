"""The names of Lightning's checkpoint files: ``filename`` templates, versions, ``last``, the YAML of
the best ones (a mixin of the mirror's ``ModelCheckpoint``)."""

from __future__ import annotations

import os
import re
from typing import Any

import torch

_FIELD = re.compile(r"(\{.*?)[:\}]")


class CheckpointNames:
    """``format_checkpoint_name`` and the file helpers of Lightning's ModelCheckpoint."""

    CHECKPOINT_JOIN_CHAR = "-"
    CHECKPOINT_EQUALS_CHAR = "="
    CHECKPOINT_NAME_LAST = "last"
    FILE_EXTENSION = ".ckpt"
    STARTING_VERSION = 1

    filename: str | None
    auto_insert_metric_name: bool

    def _format_checkpoint_name(self, filename: str | None, metrics: dict[str, Any], prefix: str | None = None,
                                auto_insert_metric_name: bool = True) -> str:
        """``filename`` (default ``{epoch}-{step}``) with its ``{name}`` / ``{name:format}`` fields filled
        from ``metrics`` (a missing one counts as 0); ``auto_insert_metric_name`` writes ``name=`` before each."""
        if not filename:
            filename = "{epoch}" + self.CHECKPOINT_JOIN_CHAR + "{step}"
        # longest names first, so that "{val_loss_2}" is not cut by "{val_loss}"
        for group in sorted(_FIELD.findall(filename), key=len, reverse=True):
            name = group[1:]
            if auto_insert_metric_name:
                filename = filename.replace(group, name + self.CHECKPOINT_EQUALS_CHAR + "{" + name)
            filename = filename.replace(group, "{0[" + name + "]")  # a name with "/" or "." still formats
            metrics.setdefault(name, torch.tensor(0))
        filename = filename.format(metrics)
        return self.CHECKPOINT_JOIN_CHAR.join([prefix, filename]) if prefix is not None else filename

    def format_checkpoint_name(self, metrics: dict[str, Any], filename: str | None = None, ver: int | None = None,
                               prefix: str | None = None) -> str:
        """The path of the checkpoint file for ``metrics`` (``{"epoch": 2, "val_loss": 0.12}``):
        ``dirpath/<filename template filled>[-v<ver>].ckpt``."""
        name = self._format_checkpoint_name(filename or self.filename, metrics, prefix=prefix,
                                            auto_insert_metric_name=self.auto_insert_metric_name)
        if ver is not None:
            name = self.CHECKPOINT_JOIN_CHAR.join((name, f"v{ver}"))
        name += self.FILE_EXTENSION
        dirpath = self.__dict__.get("_dirpath")
        return os.path.join(dirpath, name) if dirpath else name

    def _versioned(self, metrics: dict[str, Any], filename: str | None, keep: str | None) -> str:
        """The name for ``metrics``, with ``-v1``, ``-v2`` ... while a file of that name exists (but ``keep``)."""
        path = self.format_checkpoint_name(metrics, filename)
        if not self._enable_version_counter:
            return path
        version = self.STARTING_VERSION
        while self.file_exists(path, None) and path != keep:
            path = self.format_checkpoint_name(metrics, filename, ver=version)
            version += 1
        return path

    def file_exists(self, filepath: Any, trainer: Any) -> bool:
        """Whether ``filepath`` exists (a shared file system: every rank sees the same)."""
        return os.path.exists(filepath)

    def _find_last_checkpoints(self, trainer: Any) -> set[str]:
        """The ``last*.ckpt`` files in the checkpoint folder."""
        folder = self.__dict__.get("_dirpath")
        if not folder or not os.path.isdir(folder):
            return set()
        pattern = re.compile(rf"^{re.escape(self.CHECKPOINT_NAME_LAST)}(-(\d+))?")
        return {os.path.normpath(os.path.join(folder, name)) for name in os.listdir(folder)
                if name.endswith(self.FILE_EXTENSION) and pattern.match(name[:-len(self.FILE_EXTENSION)])}

    @staticmethod
    def _link_checkpoint(trainer: Any, filepath: str, linkpath: str) -> None:
        """``linkpath`` made a relative link to ``filepath`` (a copy where links cannot be made); rank 0."""
        if trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath):
            if os.path.islink(linkpath) or os.path.isfile(linkpath):
                os.remove(linkpath)
            elif os.path.isdir(linkpath):
                import shutil

                shutil.rmtree(linkpath)
            try:
                os.symlink(os.path.relpath(filepath, os.path.dirname(linkpath)), linkpath)
            except OSError:
                import shutil

                shutil.copy(filepath, linkpath)
        from trainer.runtime import distributed

        distributed.barrier()

    def to_yaml(self, filepath: Any = None) -> None:
        """Write ``best_k_models`` (path: score) as YAML (default ``dirpath/best_k_models.yaml``)."""
        import yaml

        best = {path: float(score) for path, score in self.best_k_models.items()}
        target = filepath if filepath is not None else os.path.join(self.dirpath, "best_k_models.yaml")
        with open(target, "w", encoding="utf-8") as handle:
            yaml.dump(best, handle)
