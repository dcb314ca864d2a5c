"""MLflow: one run per job, created by rank 0 only, continued when the job resumes."""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any, Mapping
from urllib.parse import unquote, urlparse

from trainer.loggers.background_writer import QueuedWrites
from trainer.loggers.base import DummyExperiment, Logger, writes_here
from trainer.loggers.mlflow_store import flat_params, last_steps, tracking_location
from trainer.loggers.wandb_run_id import MLFLOW_RUN_ID_FILE, store_run_id, stored_run_id
from trainer.runtime.redact import redact_secrets, secret_values

log = logging.getLogger(__name__)

#: ``finalize(status)`` -> MLflow's run status.
RUN_STATUS = {"success": "FINISHED", "finished": "FINISHED", "failed": "FAILED", "killed": "KILLED",
              "interrupted": "KILLED"}
_BATCH = 100  # params (and metrics) per log_batch call: MLflow's smallest per-call limit
_METRIC_NAME_BAD = re.compile(r"[^\w/.\- :]")  # what MLflow refuses in a metric name


class MLFlowLogger(QueuedWrites, Logger):
    """Logs to one MLflow run per job: metrics (with their step), the resolved config as params
    (flattened with "/", secrets redacted) and as the artifact ``config.yaml``, the run's tags, and
    at the end the run's status (and the last checkpoint's path as the tag ``checkpoint``).

    Only rank 0 writes; mlflow is imported at the first write, not before. The run starts at the
    first ``log_hyperparams`` or ``log_metrics`` (or use of ``experiment``, ``run_id``,
    ``experiment_id``). The import, the run's start and every write happen on a thread of the
    logger's own (trainer/loggers/background_writer.py): a logging step only queues its numbers;
    ``experiment``, ``run_id``, ``experiment_id``, ``name``, ``version`` and ``finalize()`` first
    wait for what is queued, and raise a write's error. Built by name (``loggers=["mlflow"]``,
    ``conf/logger/mlflow.yaml``), its id is stored in ``<run_dir>/mlflow_run_id``: a job resumed in the same run directory (or from a
    checkpoint of it into a new one) continues the same MLflow run. MLflow's metric history only
    grows, so a continued run logs a metric only at steps after the last one MLflow holds for it
    (read back through ``MlflowClient.get_metric_history``), and a resume fills from metrics.jsonl
    the steps up to the checkpoint it lacks (`resume_at`): every step once.

    Built as Lightning's (``MLFlowLogger(experiment_name="lightning_logs", run_name=None,
    tracking_uri=$MLFLOW_TRACKING_URI, tags=None, save_dir="./mlruns", ...)``).

    Args:
        experiment_name: the MLflow experiment (created if missing).
        run_name: the run's display name (redacted as the config).
        tracking_uri: a tracking server (``http://127.0.0.1:5000``), a database URI
            (``sqlite:///mlflow.db``), a ``file:`` store, or a directory: a local store there
            (``<dir>/mlflow.db`` and ``<dir>/artifacts``; ``mlflow ui --backend-store-uri
            sqlite:///<dir>/mlflow.db`` shows it). None: ``$MLFLOW_TRACKING_URI``, else ``save_dir``.
        tags: the run's tags (name -> value), redacted as the config.
        save_dir: the directory of the local store used when there is no ``tracking_uri``.
        log_model: uploading checkpoints as artifacts is not supported: anything but False is refused.
        prefix: put before every metric name, joined with "-".
        artifact_location: where a new experiment keeps its artifacts (None: the store's default).
        run_id: continue this run (its experiment is then the run's).
        checkpoint_path_prefix: concerns ``log_model``: anything but "" is refused.
        synchronous: asynchronous logging is not supported (a resume reads back what MLflow holds):
            anything but None or True is refused.
        log_checkpoint_path: tag the run with the path of ``<run_dir>/checkpoints``'s last
            checkpoint when it ends (built by name only; the run directory is known then).
    """

    def __init__(
        self,
        experiment_name: str = "lightning_logs",
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: Mapping[str, Any] | None = None,
        save_dir: str | None = "./mlruns",
        log_model: Any = False,
        prefix: str = "",
        artifact_location: str | None = None,
        run_id: str | None = None,
        checkpoint_path_prefix: str = "",
        synchronous: bool | None = None,
        log_checkpoint_path: bool = False,
    ):
        if log_model or checkpoint_path_prefix:
            raise ValueError(f"MLFlowLogger(log_model={log_model!r}, checkpoint_path_prefix={checkpoint_path_prefix!r}): "
                             "uploading checkpoints as MLflow artifacts is not supported here; leave both unset "
                             "(checkpoints stay in the run's checkpoints/ folder; log_checkpoint_path tags the last one)")
        if synchronous not in (None, True):
            raise ValueError(f"MLFlowLogger(synchronous={synchronous!r}): asynchronous logging is not supported (a "
                             "resumed run reads back what MLflow holds); leave it unset")
        if tags is not None and not isinstance(tags, Mapping):
            raise TypeError(f"MLFlowLogger(tags={tags!r}) must be a mapping (tag name -> value)")
        if tracking_uri is None and save_dir is None and not os.environ.get("MLFLOW_TRACKING_URI"):
            raise ValueError("MLFlowLogger(tracking_uri=None, save_dir=None): give a tracking URI or a directory "
                             "(or set $MLFLOW_TRACKING_URI)")
        self.experiment_name = experiment_name
        self.run_name = run_name
        self.tracking_uri_setting = tracking_uri
        self.tags = dict(tags or {})
        self.save_dir_setting = None if save_dir is None else os.fspath(save_dir)
        self.artifact_location = artifact_location
        self._prefix = prefix
        self._run_id = run_id
        self._experiment_id: str | None = None
        self.log_checkpoint_path = log_checkpoint_path
        self.id_dir: str | None = None  # where the run id is kept (the run directory, built by name)
        self._client: Any = None  # the MlflowClient once started
        self._active = False  # the run is started (RUNNING) by this process
        self._held: dict[str, int] = {}  # metric -> the last step MLflow held when this process took the run on
        self._secrets: list[str] = []
        self._logged_params: dict[str, str] = {}
        self._warned: set[str] = set()

    @classmethod
    def in_run_dir(cls, run_dir: str, tracking_uri: str | None = None, experiment_name: str = "trainer",
                   run_name: str | None = None, run_id: str | None = None, tags: Mapping[str, Any] | None = None,
                   artifact_location: str | None = None, log_checkpoint_path: bool = True) -> MLFlowLogger:
        """The logger ``loggers=["mlflow"]`` builds: the run id kept in ``<run_dir>/mlflow_run_id``;
        without ``tracking_uri`` (nor ``$MLFLOW_TRACKING_URI``) a local store in ``./mlruns``."""
        logger = cls(experiment_name=experiment_name, run_name=run_name, tracking_uri=tracking_uri, tags=tags,
                     artifact_location=artifact_location, run_id=run_id, log_checkpoint_path=log_checkpoint_path)
        logger.id_dir = run_dir
        return logger

    # Lightning's attributes
    @property
    def experiment(self) -> Any:
        """The ``MlflowClient`` (the run started now if need be) on rank 0; a DummyExperiment elsewhere."""
        if not writes_here():
            return DummyExperiment()
        self._started()
        return self._client

    @property
    def run_id(self) -> str | None:
        """The MLflow run's id (the run started now if need be, on rank 0)."""
        if writes_here():
            self._started()
        return self._run_id

    @property
    def experiment_id(self) -> str | None:
        """The MLflow experiment's id (the run started now if need be, on rank 0)."""
        if writes_here():
            self._started()
        return self._experiment_id

    @property
    def name(self) -> str | None:
        """The experiment id (None until the run starts)."""
        self._written()
        return self._experiment_id

    @property
    def version(self) -> str | None:
        """The run id (None until the run starts unless given)."""
        self._written()
        return self._run_id

    @property
    def save_dir(self) -> str | None:
        """The local folder the runs are kept in (None for a server or a remote database)."""
        uri, _ = tracking_location(self.tracking_uri_setting, self.save_dir_setting or "./mlruns")
        for scheme in ("sqlite:///", "file:"):
            if uri.startswith(scheme):
                path = unquote(urlparse(uri).path) if scheme == "file:" else uri[len(scheme):]
                return os.path.dirname(path) if scheme == "sqlite:///" else path
        return None

    log_dir = save_dir

    @staticmethod
    def check_options(tracking_uri: Any = None, tags: Any = None, **_: Any) -> None:
        """Reject bad option values when the Trainer is built, before any worker starts."""
        if tracking_uri is not None and not isinstance(tracking_uri, (str, os.PathLike)):
            raise ValueError(f"logger.mlflow.tracking_uri={tracking_uri!r}: give a server URL, a database URI or a directory")
        if tags is not None and not isinstance(tags, Mapping):
            raise ValueError(f"logger.mlflow.tags={tags!r} must be a mapping (tag name -> value)")

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        if not writes_here():
            return
        self._secrets = sorted(set(self._secrets) | set(secret_values(dict(params))), key=len, reverse=True)
        config = redact_secrets(dict(params), secrets=self._secrets)
        self._submit(lambda _: self._log_params(config))

    def _log_params(self, config: dict) -> None:
        """On the writer thread: the run started if need be, then ``config`` as its params and artifact."""
        self._start()
        from mlflow.entities import Param

        new, changed = {}, []
        for name, value in flat_params(config).items():
            if name not in self._logged_params:
                new[name] = value
            elif self._logged_params[name] != value:
                changed.append(name)
        if changed:  # MLflow params cannot change: the continued run keeps the first values
            log.warning("MLflow run %s keeps its earlier values of %s (a param cannot change); the config "
                        "artifact config.yaml shows the new ones", self._run_id, sorted(changed))
        items = [Param(name, value) for name, value in new.items()]
        for start in range(0, len(items), _BATCH):
            self._client.log_batch(self._run_id, params=items[start:start + _BATCH])
        self._logged_params.update(new)
        self._client.log_dict(self._run_id, config, "config.yaml")

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        if not writes_here():
            return
        timestamp = int(time.time() * 1000)
        numbers = []  # (name, Python float): read now, written on the writer thread
        for key, value in metrics.items():
            name = self._metric_name(key)
            number = self._number(name, value)
            if number is not None:
                numbers.append((name, number))
        self._submit(lambda _: self._log_numbers(numbers, timestamp, step))

    def _log_numbers(self, numbers: list[tuple[str, float]], timestamp: int, step: int | None) -> None:
        """On the writer thread: the run started if need be, then the numbers MLflow lacks at ``step``."""
        self._start()
        from mlflow.entities import Metric

        items = [Metric(name, number, timestamp, step or 0) for name, number in numbers
                 if step is None or step > self._held.get(name, -1)]  # (a step MLflow holds already: its history only grows)
        for start in range(0, len(items), _BATCH):
            self._client.log_batch(self._run_id, metrics=items[start:start + _BATCH])

    def resume_at(self, step: int, history: list | None, dropped_from: int | None,
                  earlier_run_dir: str | None = None) -> None:
        """A resume from the checkpoint at ``step``: MLflow holds what the killed run logged (each call
        was written when made), possibly past ``step``. The steps up to ``step`` it lacks are logged
        from ``history`` (metrics.jsonl's calls up to the checkpoint); later calls for a step it holds
        are left out (the killed run's value stands: equal in an exact resume)."""
        if not writes_here():
            return
        from trainer.loggers.resume_history import merged_by_step

        self._written()
        self._start()
        for row_step, values in merged_by_step(history or [], 0, step):
            self.log_metrics(values, row_step)

    def finalize(self, status: str = "success") -> None:
        """End the run: ``success`` is FINISHED, ``failed`` FAILED, ``killed`` KILLED (MLflow's names work too)."""
        mlflow_status = RUN_STATUS.get(status, status.upper() if isinstance(status, str) else status)
        if mlflow_status not in set(RUN_STATUS.values()):
            raise ValueError(f"MLFlowLogger.finalize({status!r}): give one of {sorted(RUN_STATUS)}")
        try:
            self._close_writes()  # what is queued, written (a write's error raised here, after the end below)
        finally:
            self._end(mlflow_status)

    def _end(self, mlflow_status: str) -> None:
        if not self._active or self._client is None:
            return
        checkpoint = self._last_checkpoint() if self.log_checkpoint_path else None
        if checkpoint is not None:
            self._client.set_tag(self._run_id, "checkpoint", checkpoint)
        self._client.set_terminated(self._run_id, mlflow_status)
        self._active = False

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.update(_client=None, _active=False, _writes=None)  # a copy (a spawned worker's) starts or continues the run itself
        return state

    def _started(self) -> None:
        """Wait for the queued writes, then start the run unless this process did already (a
        finished run is not restarted by a read)."""
        self._written()
        if self._client is None:
            self._start()

    def _start(self) -> None:
        """Start or continue the run (RUNNING), unless it is running."""
        if self._active:
            return
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        uri, default_artifacts = tracking_location(self.tracking_uri_setting, self.save_dir_setting or "./mlruns")
        try:
            client = MlflowClient(tracking_uri=uri)
        except MlflowException as error:
            raise RuntimeError(f"MLflow tracking_uri={uri!r}: {str(error).splitlines()[0]}") from None
        run_id = self._run_id or (stored_run_id(self.id_dir, MLFLOW_RUN_ID_FILE) if self.id_dir else None)
        run = self._existing_run(client, run_id, given=self._run_id is not None) if run_id else None
        if run is not None:
            client.update_run(run.info.run_id, status="RUNNING")
            self._held = last_steps(client, run.info.run_id)
            self._logged_params = dict(run.data.params)
        else:
            experiment_id = self._experiment(client, self.artifact_location or default_artifacts)
            tags = {str(k): str(v) for k, v in redact_secrets(self.tags, secrets=self._secrets).items()}
            run_name = redact_secrets(self.run_name, secrets=self._secrets) if self.run_name else None
            run = client.create_run(experiment_id, run_name=run_name, tags=tags)
            self._held, self._logged_params = {}, {}
        self._client = client
        self._run_id, self._experiment_id = run.info.run_id, run.info.experiment_id
        if self.id_dir:
            store_run_id(self.id_dir, self._run_id, MLFLOW_RUN_ID_FILE)
        self._active = True

    def _existing_run(self, client: Any, run_id: str, given: bool) -> Any:
        from mlflow.exceptions import MlflowException

        try:
            return client.get_run(run_id)
        except MlflowException:
            if given:
                raise ValueError(f"MLFlowLogger(run_id={run_id!r}): no such run at {client.tracking_uri}") from None
            log.warning("the MLflow run %s stored in %s is not at %s: starting a new run", run_id,
                        os.path.join(self.id_dir or "", MLFLOW_RUN_ID_FILE), client.tracking_uri)
            return None

    def _experiment(self, client: Any, artifact_location: str | None) -> str:
        experiment = client.get_experiment_by_name(self.experiment_name)
        if experiment is None:
            return client.create_experiment(self.experiment_name, artifact_location=artifact_location)
        if experiment.lifecycle_stage == "deleted":
            raise ValueError(f"the MLflow experiment {self.experiment_name!r} is deleted at {client.tracking_uri}: "
                             "restore it (`mlflow experiments restore`) or choose another experiment_name")
        return experiment.experiment_id

    def _metric_name(self, key: str) -> str:
        name = f"{self._prefix}-{key}" if self._prefix else str(key)
        clean = _METRIC_NAME_BAD.sub("_", name)
        if clean != name and name not in self._warned:
            self._warned.add(name)
            log.warning("MLflow metric names take letters, digits, _ - . / : and spaces: %r is logged as %r", name, clean)
        return clean

    def _number(self, name: str, value: Any) -> float | None:
        try:
            return float(value)
        except (TypeError, ValueError):
            if name not in self._warned:
                self._warned.add(name)
                log.warning("MLflow takes numbers as metrics: %r (%s) is not logged there", name, type(value).__name__)
            return None

    def _last_checkpoint(self) -> str | None:
        if not self.id_dir:
            return None
        from trainer.checkpoint.layout import find_latest

        root = os.path.join(self.id_dir, "checkpoints")
        return find_latest(root) if os.path.isdir(root) else None
