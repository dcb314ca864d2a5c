"""Lightning's ``<save_dir>/<name>/version_<n>`` directories for loggers built with ``save_dir``."""

from __future__ import annotations

import os
import warnings
from typing import Any

from trainer.loggers.remote_files import is_remote, remote_versions


def next_version(root: str) -> int:
    """One more than the highest ``version_<n>`` folder in ``root`` (0 if none; a URL read through fsspec)."""
    if is_remote(root):
        names = remote_versions(root)
    else:
        try:
            names = [name for name in os.listdir(root) if os.path.isdir(os.path.join(root, name))]
        except OSError:
            return 0
    found = [int(name[len("version_"):]) for name in names
             if name.startswith("version_") and name[len("version_"):].isdigit()]
    return max(found) + 1 if found else 0


class VersionedDir:
    """``save_dir`` / ``name`` / ``version``: where a logger writes, as Lightning's file loggers lay it out.

    ``name`` "" or None: no per-experiment folder. ``version`` None: the next free ``version_<n>``
    (chosen at the first read, then fixed; the trainer fixes it before workers start and gives rank 0's
    to every rank); an int: ``version_<n>``; a string: that folder ("" : none).
    """

    def __init__(self, save_dir: Any, name: str | None, version: int | str | None, sub_dir: Any = None):
        if save_dir is None:
            raise TypeError("save_dir is required: the folder the logger writes into")
        if version is not None and (isinstance(version, bool) or not isinstance(version, (int, str))):
            raise TypeError(f"version={version!r} must be None, an int or a string")
        self._save_dir = os.fspath(save_dir)
        self._name = name or ""
        self._version = version
        self._sub_dir = os.fspath(sub_dir) if sub_dir is not None else None

    @property
    def save_dir(self) -> str:
        return self._save_dir

    @property
    def name(self) -> str:
        return self._name

    @property
    def root_dir(self) -> str:
        return os.path.join(self._save_dir, self._name) if self._name else self._save_dir

    @property
    def version(self) -> int | str:
        if self._version is None:
            self._version = next_version(self.root_dir)
        return self._version

    @version.setter
    def version(self, value: int | str) -> None:
        self._version = value


class VersionedFolders:
    """Lightning's folder attributes of a file logger that keeps a `VersionedDir` as ``_dirs``
    (a mixin of the CSV and TensorBoard loggers). ``root_dir`` and ``log_dir`` are read from the
    ``save_dir``, ``name`` and ``version`` properties, so a subclass that overrides one of them (as
    Lightning's tests do) moves the folders with it."""

    _dirs: VersionedDir

    name = property(lambda self: self._dirs.name, doc="The experiment folder under save_dir ('' for none).")
    save_dir = property(lambda self: self._dirs.save_dir, doc="The folder given (or the run directory).")
    sub_dir = property(lambda self: self._dirs._sub_dir, doc="One more folder under the version's (None: none).")

    @property
    def root_dir(self) -> str:
        """save_dir / name."""
        return os.path.join(self.save_dir, self.name) if self.name else self.save_dir

    @property
    def log_dir(self) -> str:
        """Where the logger's files go: root_dir / version_<n> (or the version's own name) / sub_dir,
        with ``~`` and ``$VARIABLES`` expanded."""
        version = self.version if isinstance(self.version, str) else f"version_{self.version}"
        path = os.path.join(self.root_dir, version) if version else self.root_dir
        if self.sub_dir:
            path = os.path.join(path, self.sub_dir)
        return os.path.expanduser(os.path.expandvars(path))

    @property
    def version(self) -> int | str:
        """The version folder's number (or name): the next free one unless given."""
        return self._dirs.version

    @version.setter
    def version(self, value: int | str) -> None:
        self._dirs.version = value


class AppendedFile:
    """A logger writing one file it opens on its first write (``_file``): closed by ``finalize``, and
    not copied into a spawned worker (which opens it itself). A mixin of the CSV and jsonl loggers."""

    _file: Any = None

    def finalize(self, status: str = "success") -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_file"] = None  # a copy (a spawned worker's) opens the file itself
        return state


def replace_existing_log_dir(log_dir: str, metrics_file: str) -> None:
    """Lightning's check of a version folder given by hand: when it holds files, a UserWarning that
    they are replaced, and ``metrics_file`` removed (a new run's rows start a new file)."""
    if os.path.isdir(log_dir) and os.listdir(log_dir):
        warnings.warn(f"Experiment logs directory {log_dir} exists and is not empty. Previous log files in this "
                      "directory will be deleted when the new ones are saved!", UserWarning, stacklevel=3)
        if os.path.isfile(metrics_file):
            os.remove(metrics_file)
