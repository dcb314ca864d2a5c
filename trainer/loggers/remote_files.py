"""A logger's files at a URL (``memory://``, ``s3://``, ``gcs://`` ...), written through fsspec:
`RemoteCSV` keeps a CSV file's rows and writes the whole file when asked (a remote file is not
truncated and appended to in place as the local one is). fsspec is imported only for such a path."""

from __future__ import annotations

import csv
import io
import os
from typing import Any, Mapping

from trainer.loggers.hparams_file import FILENAME, hparams_yaml_text


def is_remote(path: Any) -> bool:
    """Whether ``path`` is a URL of a file system other than the local one (``file://`` is local)."""
    text = os.fspath(path) if path is not None else ""
    return "://" in text and not text.startswith("file://")


def url_fs(path: str) -> tuple[Any, str]:
    """fsspec's file system and path for the URL ``path``."""
    import fsspec

    return fsspec.core.url_to_fs(path)


class RemoteCSV:
    """The rows of a CSV file at the URL ``path`` (``rows``: dicts with a ``step``; ``columns`` in
    the order the names first appeared), written whole by `write` / `close`."""

    def __init__(self, path: str, rows: list[tuple[int, dict[str, Any]]]):
        self.path = path
        self.rows = [{**row, "step": step} for step, row in rows]
        self.columns = ["step"] + [name for row in self.rows for name in row if name != "step"]
        self.columns = list(dict.fromkeys(self.columns))

    def add(self, row: Mapping[str, Any], replace_last_row: bool) -> None:
        """Add ``row`` (in place of the last row when it is the same step's)."""
        if replace_last_row and self.rows:
            self.rows[-1] = dict(row)
        else:
            self.rows.append(dict(row))
        self.columns.extend(name for name in row if name not in self.columns)

    def write(self) -> None:
        """The whole file, written through fsspec (its folder made)."""
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=self.columns, restval="", lineterminator="\n")
        writer.writeheader()
        writer.writerows(self.rows)
        fs, path = url_fs(self.path)
        fs.makedirs(os.path.dirname(path), exist_ok=True)
        with fs.open(path, "w") as f:
            f.write(buffer.getvalue())

    def close(self) -> None:
        """Write the file (a logger's ``finalize``)."""
        self.write()

    @staticmethod
    def read_text(path: str) -> str:
        """The text of the file at the URL ``path`` ("" when there is none)."""
        fs, local = url_fs(path)
        if not fs.isfile(local):
            return ""
        with fs.open(local, "r") as f:
            return f.read()

    @staticmethod
    def write_hparams(log_dir: str, params: Mapping[str, Any]) -> None:
        """``hparams.yaml`` in the URL folder ``log_dir``."""
        fs, folder = url_fs(log_dir)
        fs.makedirs(folder, exist_ok=True)
        with fs.open(os.path.join(folder, FILENAME), "w") as f:
            f.write(hparams_yaml_text(params))


def remote_versions(root: str) -> list[str]:
    """The names of the entries of the URL folder ``root`` (none when it does not exist)."""
    fs, folder = url_fs(root)
    if not fs.isdir(folder):
        return []
    return [os.path.basename(entry.rstrip("/")) for entry in fs.ls(folder, detail=False) if fs.isdir(entry)]
