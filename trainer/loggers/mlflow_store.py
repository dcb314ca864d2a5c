"""Where an MLflow run is kept and what it already holds: the tracking URI a setting names, the
params a config becomes, and the last step of each metric an existing run has (read back
through MLflow's client). No mlflow import here: the client is passed in."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Mapping

#: The database a directory given as ``tracking_uri`` holds (MLflow 3 refuses its ``file:`` store by default).
DATABASE_FILE = "mlflow.db"
#: The artifacts of a directory store, next to its database.
ARTIFACTS_FOLDER = "artifacts"
#: What MLflow takes in a param value (MLflow's ``MAX_PARAM_VAL_LENGTH``).
MAX_PARAM_VALUE_LENGTH = 6000
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def tracking_location(tracking_uri: Any, default_dir: str) -> tuple[str, str | None]:
    """The tracking URI and the artifact location of new experiments (None: the store's default)
    for the setting ``tracking_uri``:

    - a URI (``http://host:5000``, ``https://...``, ``sqlite:///...``, ``postgresql://...``,
      ``databricks``, ``file:/...``) is used as given;
    - a directory path is a local store in that directory: ``<dir>/mlflow.db`` (SQLite), artifacts
      in ``<dir>/artifacts``;
    - None: ``$MLFLOW_TRACKING_URI`` if set, else the directory ``default_dir`` as above.
    """
    if tracking_uri is None:
        tracking_uri = os.environ.get("MLFLOW_TRACKING_URI") or None
    if tracking_uri is None:
        return directory_store(default_dir)
    tracking_uri = os.fspath(tracking_uri)
    if not isinstance(tracking_uri, str) or not tracking_uri:
        raise ValueError(f"logger.mlflow.tracking_uri={tracking_uri!r}: give a server URL, a database URI or a directory")
    if tracking_uri == "databricks" or (_SCHEME.match(tracking_uri) and not _is_windows_drive(tracking_uri)):
        return tracking_uri, None
    return directory_store(tracking_uri)


def directory_store(directory: str) -> tuple[str, str]:
    """A local store in ``directory``: its SQLite URI and the artifact location of its experiments."""
    folder = Path(directory).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / DATABASE_FILE}", (folder / ARTIFACTS_FOLDER).as_uri()


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """``config`` (nested mappings) as MLflow params: names joined with "/", values as text (lists
    as their repr), a value longer than MLflow takes cut to its limit."""
    params: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            params.update(flat_params(value, name))
        else:
            params[name] = str(value)[:MAX_PARAM_VALUE_LENGTH]
    return params


def last_steps(client: Any, run_id: str) -> dict[str, int]:
    """The highest step of each metric the run ``run_id`` holds (MLflow's metric history, which
    only grows: a resumed run logs only the steps after these)."""
    run = client.get_run(run_id)
    return {key: max((point.step for point in client.get_metric_history(run_id, key)), default=0)
            for key in run.data.metrics}


def _is_windows_drive(text: str) -> bool:
    return len(text) > 2 and text[1] == ":" and text[2] in "\\/"
