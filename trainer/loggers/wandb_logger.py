"""Weights & Biases: one run per job, created by rank 0 only, continued when the job resumes."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import uuid
import weakref
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

from trainer.loggers.background_writer import QueuedWrites, python_number
from trainer.loggers.base import DummyExperiment, Logger, writes_here
from trainer.loggers.wandb_mode import DEFAULT_BASE_URL, MODES, resolve_mode, server_reachable
from trainer.loggers.wandb_run_id import store_run_id, stored_run_id
from trainer.runtime.redact import redact_argv, redact_secrets, secret_values

log = logging.getLogger(__name__)


def _finalize_at_exit(reference: weakref.ref) -> None:
    """At interpreter exit: what a logger holds queued, written, and its run finished (a run that
    starts during the exit, from what was queued, is past W&B's own exit hooks)."""
    logger = reference()
    if logger is not None:
        try:
            logger.finalize()
        except Exception:  # exiting: an error of a logger's write must not hide the program's own
            log.warning("W&B: writing what was queued at exit failed", exc_info=True)


@contextmanager
def _redacted_argv(secrets: list[str]) -> Iterator[None]:
    """W&B records ``sys.argv`` in the run's metadata: hide secrets typed as overrides."""
    original = sys.argv[:]
    sys.argv[:] = redact_argv(original, secrets=secrets)
    try:
        yield
    finally:
        sys.argv[:] = original


class WandbLogger(QueuedWrites, Logger):
    """Logs to one W&B run per job, files under ``<run_dir>/wandb/``.

    The trainer builds loggers on rank 0 only, so a multi-process job makes one run, not one per
    rank. The run starts at the first ``log_hyperparams`` (with the resolved config, secrets
    redacted, as the W&B config) or ``log_metrics``; wandb is imported then, not before. Both, and
    every write, happen on a thread of the logger's own (trainer/loggers/background_writer.py): a
    logging step only queues its values, already Python numbers; ``experiment``, ``version`` and
    ``finalize()`` first wait for what is queued, and raise a write's error. Its id is
    stored in ``<run_dir>/wandb_run_id``: a job resumed in the same run directory continues the
    same run (``resume="allow"``). A resumed job brings the run back to its checkpoint
    (`resume_at`): the steps W&B had not written out when the job was killed are logged again
    from metrics.jsonl, and a step it holds is not logged twice.

    Never hangs on a missing network: in ``auto`` mode without an API key the run is offline
    (``wandb sync <run_dir>/wandb/offline-run-*`` uploads it later); with a key, a server that
    does not answer a TCP connect within 3 s, or an init that fails within ``init_timeout_s``,
    makes it offline with a warning. In ``online`` mode the same failures raise an error instead.

    Built as Lightning's (``WandbLogger(name=None, save_dir=".", version=None, offline=False,
    project=None, ...)``): ``save_dir`` (or ``dir``) is the run's folder, ``version`` (or ``id``) its id;
    more keywords go to ``wandb.init``. Built by name (``loggers=["wandb"]``, ``conf/logger/``): in the
    run directory (``in_run_dir``). Lightning's ``name`` attribute is the project, ``version`` the run id.

    Args:
        name: the run's display name, as ``wandb.init``'s (None: W&B's default). Redacted as the
            config (a secret in it is written ``***``), as are ``project``, ``entity``, ``group``,
            ``tags``, ``notes`` and the other ``wandb.init`` keywords.
        save_dir: the folder W&B writes into (``<save_dir>/wandb``) and the run id is kept in.
        version: the run id to use (None: the stored one, else a new one). Set it (or call
            `trainer.loggers.wandb_run_id.adopt_run_id`) to continue a run from another run directory.
        offline: True is ``mode="offline"``.
        dir: another name for ``save_dir`` (``wandb.init``'s).
        id: another name for ``version`` (``wandb.init``'s).
        anonymous: True lets W&B log without an account (``anonymous="allow"``).
        project: the W&B project, as ``wandb.init``'s (None: W&B's default, e.g. ``$WANDB_PROJECT``).
        log_model: uploading checkpoints as W&B artifacts is not supported: anything but False is refused.
        experiment: a W&B run already started, to log into.
        prefix: put before every metric name, joined with "-".
        checkpoint_name: the artifact name for ``log_model``: not supported, anything but None is refused.
        entity: the W&B user or team, as ``wandb.init``'s (None: W&B's default).
        group: the W&B run group, as ``wandb.init``'s.
        tags: the W&B run's tags, as ``wandb.init``'s.
        notes: the W&B run's notes, as ``wandb.init``'s.
        mode: ``auto`` (``$WANDB_MODE`` if set, else online with an API key, offline without),
            ``online``, ``offline`` or ``disabled`` (log nothing, import nothing).
        init_timeout_s: how long ``wandb.init`` may wait for the server.
        **init_options: more ``wandb.init`` keywords (``job_type``, ...). ``config`` (a mapping) is
            the W&B config together with the run's own (its values win on a name both have, with
            one warning naming them), redacted as the rest.
    """

    def __init__(
        self,
        name: str | None = None,
        save_dir: Any = ".",
        version: str | None = None,
        offline: bool = False,
        dir: Any = None,
        id: str | None = None,
        anonymous: bool | None = None,
        project: str | None = None,
        log_model: Any = False,
        experiment: Any = None,
        prefix: str = "",
        checkpoint_name: str | None = None,
        entity: str | None = None,
        group: str | None = None,
        tags: list[str] | None = None,
        notes: str | None = None,
        mode: str = "auto",
        init_timeout_s: float = 60.0,
        **init_options: Any,
    ):
        if log_model or checkpoint_name is not None:
            raise ValueError(f"WandbLogger(log_model={log_model!r}, checkpoint_name={checkpoint_name!r}): uploading "
                             "checkpoints as W&B artifacts is not supported here; leave both unset (checkpoints stay "
                             "in the run's checkpoints/ folder)")
        taken = sorted(set(init_options) & {"resume", "settings", "reinit"})
        if init_options.get("add_file_policy", "mutable") != "mutable":
            raise ValueError("WandbLogger(add_file_policy=...) concerns log_model, which is not supported; leave it unset")
        init_options.pop("add_file_policy", None)
        if taken:
            raise ValueError(f"WandbLogger({', '.join(taken)}=...): set by the trainer (one run per job, resumed "
                             "with the job); use mode= / init_timeout_s= instead")
        if offline:
            if mode not in ("auto", "offline"):
                raise ValueError(f"WandbLogger(offline=True, mode={mode!r}): give one of them")
            mode = "offline"
        if version is not None and id is not None and version != id:
            raise ValueError(f"WandbLogger(version={version!r}, id={id!r}): give one of them (the same run id)")
        self.check_options(mode=mode)
        self.run_dir = os.fspath(dir if dir is not None else save_dir)
        self.mode = mode
        self.run_id = id if id is not None else version
        if anonymous:
            init_options["anonymous"] = "allow"
        user_config = init_options.pop("config", None)
        if user_config is not None and not isinstance(user_config, Mapping):
            raise TypeError(f"WandbLogger(config={user_config!r}) must be a mapping (name -> value); it is the W&B "
                            "run's config together with the run's own")
        self._user_config = dict(user_config or {})
        self._warned_config = False
        self._init_args = dict(init_options, project=project, entity=entity, name=name, group=group, tags=tags, notes=notes)
        self._project = project
        self._prefix = prefix
        self.init_timeout_s = init_timeout_s
        self._run: Any = experiment  # the wandb Run once started
        self._disabled = False
        self._secrets: list[str] = []  # values under secret-named keys of the logged config
        self._held_through = 0  # a resumed run: W&B holds the steps up to this one already

    @classmethod
    def in_run_dir(cls, run_dir: str, project: str | None = None, entity: str | None = None, name: str | None = None,
                   group: str | None = None, tags: list[str] | None = None, notes: str | None = None,
                   mode: str = "auto", id: str | None = None, init_timeout_s: float = 60.0) -> WandbLogger:
        """The logger ``loggers=["wandb"]`` builds, writing into ``<run_dir>/wandb``."""
        return cls(name=name, save_dir=run_dir, project=project, entity=entity, group=group, tags=tags, notes=notes,
                   mode=mode, id=id, init_timeout_s=init_timeout_s)

    # Lightning's attributes
    save_dir = property(lambda self: self.run_dir, doc="The folder W&B writes into.")
    log_dir = save_dir
    name = property(lambda self: self._project, doc="The project (as Lightning's; the run's name is experiment.name).")

    @property
    def run(self) -> Any:
        """The W&B run once started (None before, and after ``finalize``), what was queued written first."""
        self._written()
        return self._run

    @property
    def version(self) -> str | None:
        """The run id (None until the run starts unless given)."""
        self._written()
        return getattr(self._run, "id", None) or self.run_id

    @property
    def experiment(self) -> Any:
        """The W&B run (started now if need be) on rank 0; a DummyExperiment elsewhere or when disabled."""
        if not writes_here():
            return DummyExperiment()
        self._written()
        if self._run is None:
            self._start(None)
        return self._run if self._run is not None else DummyExperiment()

    def watch(self, model: Any, log: str | None = "gradients", log_freq: int = 100, log_graph: bool = True) -> None:
        """``wandb.watch`` the model (rank 0)."""
        self.experiment.watch(model, log=log, log_freq=log_freq, log_graph=log_graph)

    def log_image(self, key: str, images: list, step: int | None = None, **kwargs: Any) -> None:
        """Log ``images`` (tensors, arrays, PIL images or paths) as ``wandb.Image`` s under ``key`` (rank 0);
        list-valued keywords (``caption``) give one value per image."""
        if not writes_here():
            return
        import wandb

        per_image = [{k: v[i] for k, v in kwargs.items()} for i in range(len(images))]
        self.log_metrics({key: [wandb.Image(image, **extra) for image, extra in zip(images, per_image)]}, step)

    def log_table(self, key: str, columns: list | None = None, data: list | None = None, dataframe: Any = None,
                  step: int | None = None) -> None:
        """Log a ``wandb.Table`` under ``key`` (rank 0)."""
        if not writes_here():
            return
        import wandb

        self.log_metrics({key: wandb.Table(columns=columns, data=data, dataframe=dataframe)}, step)

    log_text = log_table

    @staticmethod
    def check_options(mode: str = "auto", **_: Any) -> None:
        """Reject bad option values when the Trainer is built, before any worker starts."""
        if mode not in MODES:
            raise ValueError(f"logger.wandb.mode={mode!r} is not one of {MODES}")

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        if not writes_here():
            return
        # The run's settings (notes, name, tags ...) may hold a value the config keeps under a
        # secret-named key (``notes: ${hub.hf_token}``): they are redacted with the same values.
        self._secrets = sorted(set(self._secrets) | set(secret_values(dict(params))), key=len, reverse=True)
        config = self._with_user_config(redact_secrets(dict(params), secrets=self._secrets))
        self._submit(lambda _: self._start(config) if self._run is None else
                     self._run.config.update(config, allow_val_change=True))

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        if not writes_here() or self._disabled:
            return
        if step is not None and step <= self._held_through:
            return  # the killed run's row for this step is in W&B already (its history only goes forward)
        values = {(f"{self._prefix}-{k}" if self._prefix else k): python_number(v) for k, v in metrics.items()}
        self._submit(lambda _: self._log_now(values, step))

    def _log_now(self, values: dict, step: int | None) -> None:
        """On the writer thread: the run started if need be, then ``values`` logged at ``step``."""
        if self._run is None:
            self._start(None)
        if self._run is not None:
            self._run.log(values, step=step)

    def resume_at(self, step: int, history: list | None, dropped_from: int | None,
                  earlier_run_dir: str | None = None) -> None:
        """A resume from the checkpoint at ``step``. W&B buffers what it writes, so a killed run's
        files (and, online, the server) may hold fewer steps than were logged, or more than the
        checkpoint's. Its history only goes forward (online, W&B drops a step below the run's last):
        the steps up to ``step`` that no earlier file of this run (nor the server) holds are logged
        again from ``history``, and later calls for a step it holds are left out (the killed run's
        row stands; equal to the resumed run's in an exact resume). ``earlier_run_dir``: the run
        directory of the checkpoint, when the job resumed into another one (its W&B files count too,
        and ``history`` is its metrics.jsonl)."""
        if not writes_here():
            return
        self._written()
        if self._run is None:
            self._start(None)
        if self._run is None:  # disabled
            return
        from trainer.loggers.resume_history import merged_by_step
        from trainer.loggers.wandb_history import last_step_held

        current = os.path.dirname(os.path.abspath(self._run.dir)) if getattr(self._run, "dir", None) else None
        held = max(last_step_held(os.path.join(folder, "wandb"), self._run.id, exclude_dir=current)
                   for folder in {self.run_dir, earlier_run_dir or self.run_dir})
        held = max(held, (getattr(self._run, "starting_step", 0) or 0) - 1)  # online: the server's last step
        for row_step, values in merged_by_step(history or [], held, step):
            self.log_metrics(values, row_step)
        self._held_through = held
        if held > step:
            log.info("W&B run %s holds steps up to %d from before the resume at step %d: those rows stay as "
                     "they were logged", self._run.id, held, step)

    def _with_user_config(self, config: dict) -> dict:
        """The run's config with the ``config=`` given to this logger: the user's value wins on a
        name both have (one warning names them)."""
        if not self._user_config:
            return config
        user = redact_secrets(self._user_config, secrets=self._secrets)
        kept = sorted(set(user) & set(config))
        if kept and not self._warned_config:
            self._warned_config = True
            log.warning("WandbLogger(config=...) sets %s, which the run's config has too: the W&B config shows "
                        "the values given to WandbLogger for them", kept)
        return {**config, **user}

    def finalize(self, status: str = "success") -> None:
        try:
            if self._writes is not None and self._writes.is_open:
                self._submit(lambda _: self._finish())  # (W&B called from one thread: the run's own)
            self._close_writes()  # what is queued, written (a write's error raised here)
        finally:
            self._finish()  # a run started on this thread (``experiment``), or left by a failed write
            self._disabled = True

    def _submit(self, job: Any) -> None:
        if self._writes is None:  # a script that exits without finalize: what it queued goes to the run
            atexit.register(_finalize_at_exit, weakref.ref(self))
        super()._submit(job)

    def _finish(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.update(_run=None, _writes=None)  # a copy (a spawned worker's) starts or continues the run itself
        return state

    def _start(self, config: dict | None) -> None:
        if self._disabled:
            return
        mode = resolve_mode(self.mode)
        if mode == "disabled":
            self._disabled = True
            return
        import wandb

        self.run_id = self.run_id or stored_run_id(self.run_dir) or uuid.uuid4().hex[:8]
        store_run_id(self.run_dir, self.run_id)
        init_args = dict(
            redact_secrets(self._init_args, secrets=self._secrets), dir=self.run_dir,
            config=config if config is not None else self._with_user_config({}) or None, id=self.run_id,
            resume="allow",
            settings=wandb.Settings(init_timeout=self.init_timeout_s),
        )
        if mode == "online" and not server_reachable():
            self._cannot_go_online(f"the W&B server ({os.environ.get('WANDB_BASE_URL') or DEFAULT_BASE_URL}) is unreachable")
            mode = "offline"
        with _redacted_argv(self._secrets):
            try:
                self._run = wandb.init(mode=mode, **init_args)
            except Exception as error:  # wandb.errors.CommError, timeouts, ...
                if mode != "online":
                    raise
                self._cannot_go_online(f"wandb.init failed: {type(error).__name__}: {error}")
                wandb.teardown()  # forget the failed run, or the retry finds its id "in use"
                self._run = wandb.init(mode="offline", **init_args)
        # wandb.init registered W&B's own exit hooks; exit hooks run last-registered first, so this one,
        # registered again now, writes what is still queued before W&B ends the run at exit
        atexit.register(_finalize_at_exit, weakref.ref(self))

    def _cannot_go_online(self, reason: str) -> None:
        if self.mode == "online":
            raise RuntimeError(f"logger.wandb.mode=online but {reason}; use mode=offline (then `wandb sync`) or auto")
        where = os.path.join(self.run_dir, "wandb")
        log.warning("W&B: %s; logging offline to %s (upload later with `wandb sync`)", reason, where)

