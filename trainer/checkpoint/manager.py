"""Saving and restoring a whole training run: when, what, in which format, and atomically.

Every method that touches model or optimizer state is a collective: the loop calls it on every
rank at the same step.

A save makes no barrier: every rank creates the staging folders it writes into, writes and fsyncs
its own files, and says so in the one gather that carries their sizes (DCP's own collectives
cover its data files). Rank 0 then commits (marker, rename, ``latest``) and deletes old checkpoints
in a background thread, one commit at a time, while every rank trains on; the next commit, a load,
``finish`` and ``close`` (end of training, preemption) wait for it, and its error is raised there.

A write that fails on any rank (a full disk, most often) ends the save on every rank with the same
one-line ``CheckpointError`` naming the checkpoint and the space left (``save_failure.py``): the
small files' failures travel in the gather, DCP's in its own collectives. The staging folder is
removed and ``latest`` still names the previous checkpoint. (With ``async_save`` and the full
format, rank 0 alone learns of its failed write, at its next wait; the other ranks stop at their
next collective, which fails at once when rank 0 has left.)
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import shutil
import signal
import threading
import time
import warnings
from typing import Any

import torch

from trainer.runtime import distributed
from trainer.checkpoint import integrity, layout, save_failure
from trainer.api.hparams_archive import FILENAME as HPARAMS_FILE
from trainer.checkpoint.config import CheckpointConfig
from trainer.checkpoint.file_state import FORMAT_VERSION, extras_of, new_marker
from trainer.checkpoint.loading import CheckpointError, load_file, load_training_state, load_weights
from trainer.checkpoint.state import describe_layout, get_rng_state, get_training_state, mesh_layout, set_rng_state
from trainer.checkpoint.run_states import RunStates
from trainer.checkpoint.stream_position import save_stream_state
from trainer.runtime.redact import redact_secrets
from trainer.runtime.rank_logging import rank_zero_warn
from trainer.strategies.base import Strategy

log = logging.getLogger(__name__)

SIGNALS = ("SIGTERM", "SIGUSR1")

# Read here, and imported from here by callers (their import path since before loading.py existed).
__all__ = ["FORMAT_VERSION", "CheckpointError", "CheckpointManager", "load_file", "load_training_state",
           "load_weights"]


def _copy_tensors(tree: Any) -> Any:
    """A copy whose tensors training cannot change any more (for a background write)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {k: _copy_tensors(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_copy_tensors(v) for v in tree)
    return tree


class CheckpointManager:
    """Saves and loads checkpoints for one run (see ``layout.py`` for the files)."""

    def __init__(self, config: CheckpointConfig, run_dir: str, strategy: Strategy | None = None):
        self.config = config
        self.strategy = strategy if strategy is not None else Strategy()
        self.root = os.path.abspath(config.dir or os.path.join(run_dir, "checkpoints"))
        self._pending: tuple[Any, str, dict] | None = None
        self._committer: concurrent.futures.ThreadPoolExecutor | None = None  # rank 0: commits and retention
        self._commit_future: tuple[concurrent.futures.Future, str] | None = None  # (its future, its staging)
        self._saves_of_step: tuple[int, int] = (-1, 0)  # (step, saves of it so far): a repeat gets its own staging
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._async_group: Any = None
        self._signalled: int | None = None
        self._previous_handlers: dict[int, Any] = {}
        self._told_no_monitor = False

    # ----- life cycle --------------------------------------------------------------------------------------
    def setup(self) -> None:
        if distributed.rank() == 0:
            os.makedirs(self.root, exist_ok=True)
            layout.remove_stale_staging(self.root)
        distributed.barrier()
        if self.config.async_save and distributed.is_distributed():
            # Background writes talk over their own group, so they never interleave with training's.
            self._async_group = torch.distributed.new_group(backend="gloo")
        if self.config.save_on_signal and threading.current_thread() is not threading.main_thread():
            # Python delivers signals to the main thread only: a fit run from another thread cannot listen.
            log.warning("checkpoint.save_on_signal=true, but fit runs outside the main thread, where no signal "
                        "handler can be installed: SIGTERM / SIGUSR1 will not save; run fit in the main thread")
        if self.config.save_on_signal and threading.current_thread() is threading.main_thread():
            for name in SIGNALS:
                number = getattr(signal, name, None)
                if number is not None:
                    self._previous_handlers[number] = signal.signal(number, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._signalled = signum  # acted on at the next step boundary, on every rank together

    def stop_requested(self, step: int, logging_step: bool = True) -> bool:
        """Whether any rank received a preemption signal (the same answer on every rank), asked
        after every optimizer step ``step``. Several processes agree only on logging steps (whose
        metric reduction makes collectives anyway) and every ``signal_check_every_n_steps``: the
        other steps answer False without a collective, so a signal stops the run within
        ``log_every_n_steps`` (or that many) steps. One process: every step, for free."""
        if not self.config.save_on_signal:
            return False
        if not distributed.is_distributed():
            return self._signalled is not None
        every = self.config.signal_check_every_n_steps
        if not (logging_step or (every is not None and step % every == 0)):
            return False
        return distributed.any_rank(self._signalled is not None)

    def close(self, clean: bool) -> None:
        """Finish an in-flight save (after a clean run), wait for its commit (rank 0) and restore
        the signal handlers. After an error the commit already handed to rank 0's thread still
        completes (it needs no other rank); a write still in flight is abandoned."""
        try:
            if clean:
                self.finish()
            else:
                try:
                    self._join_commit()
                except Exception as error:  # the run's own error is the one to raise
                    log.error("%s", error)
        finally:
            for number, handler in self._previous_handlers.items():
                signal.signal(number, handler)
            self._previous_handlers = {}
            if self._executor is not None:
                self._executor.shutdown(wait=clean)
            if self._committer is not None:
                self._committer.shutdown(wait=True)
                self._committer = None

    # ----- triggers ------------------------------------------------------------------------------------------
    def due_after_step(self, step: int, previous: int | None = None) -> bool:
        """After the step that took global_step from ``previous`` (default ``step - 1``) to ``step``:
        whether a multiple of ``every_n_steps`` was reached or crossed (a manual-optimization batch
        may make several optimizer steps)."""
        every = self.config.every_n_steps
        previous = step - 1 if previous is None else previous
        return bool(every) and step // every > previous // every

    def due_after_epoch(self, epoch: int) -> bool:
        return bool(self.config.every_n_epochs) and (epoch + 1) % self.config.every_n_epochs == 0

    # ----- saving ----------------------------------------------------------------------------------------------
    def save(self, states: RunStates) -> None:
        """Checkpoint the run's current state (a collective): ``states`` names its parts; the
        scheduler, precision and callbacks states go into extras.pt."""
        self.wait()
        started = time.perf_counter()
        progress = states.progress()
        rank, step, full = distributed.rank(), progress["step"], self.config.format == "full"
        # A second save of a step (an epoch end right after a periodic save) gets its own staging
        # folder: the first may still be committing (renamed away by rank 0's thread).
        again = self._saves_of_step[1] if self._saves_of_step[0] == step else 0
        self._saves_of_step = (step, again + 1)
        staging = layout.staging_path(self.root, step, again)
        state = get_training_state(states.model, states.optimizer, full, self.strategy)
        marker = new_marker(step, self.config.format, states, self.config.monitor)
        if self.config.monitor and not marker["metrics"] and not self._told_no_monitor:
            self._told_no_monitor = True  # this checkpoint cannot be ranked as best: said once
            rank_zero_warn(log, "checkpoint.monitor=%s has no logged value at step %d (logged so far: %s), so this "
                           "checkpoint is kept by keep_last only", self.config.monitor, step,
                           sorted(states.metrics) or "nothing")
        written, sizes, local_error = [], {}, None
        try:
            written = self._write_small_files(states, staging, progress)
            if full and not self.config.async_save and rank == 0:
                # Before the gather, so that its failure (a full disk) stops every rank there.
                torch.save(state, os.path.join(staging, "model_optim.pt"))
            # Each rank makes its own small files durable (in parallel, on its own node), then the one
            # gather says every rank's are written and carries their sizes: the agreement to commit.
            layout.fsync_files(staging, written)
            sizes = integrity.sizes(staging, written)
        except Exception as error:  # a full disk, most often: said in the gather, so every rank stops there
            local_error = error
        failed = save_failure.failure(local_error, rank) if local_error is not None else None
        gathered = distributed.all_gather_object((sizes, failed))
        failures = [part[1] for part in gathered if part[1] is not None]
        if failures:
            raise save_failure.abandon(staging, self.root, *failures[0]) from local_error
        marker[integrity.FILES] = {k: v for part in gathered for k, v in part[0].items()}
        try:
            if self.config.async_save:
                self._pending = (self._write_async(state, staging, full), staging, marker)
                result = None
            else:
                # DCP's save returns on its coordinator (rank 0) only after every rank's write results
                # reached it (its files fsynced): no barrier. The full format's file is written above.
                result = None if full else self._write(state, staging)
        except save_failure.WRITE_ERRORS as error:  # DCP raises any rank's failed write on every rank
            raise save_failure.abandon(staging, self.root, *save_failure.failure(error, rank)) from error
        if not self.config.async_save and rank == 0:
            self._commit_in_background(staging, marker, full, result)
        log.info("checkpoint at step %d %s in %.2f s -> %s", step,
                 "started (async)" if self.config.async_save else "written (committing in the background)",
                 time.perf_counter() - started, self.root)

    def _write_small_files(self, states: RunStates, staging: str, progress: dict) -> list[str]:
        """This rank's RNG and data-stream files; on rank 0 also trainer_state.json, extras.pt and the
        hyperparameter objects. Returns their names (relative to ``staging``)."""
        rank = distributed.rank()
        # No barrier: every rank makes the folders it writes into (setup() removed stale staging;
        # DCP makes its own folder the same way).
        os.makedirs(os.path.join(staging, "rng"), exist_ok=True)
        torch.save(get_rng_state(), os.path.join(staging, "rng", f"rank-{rank:05d}.pt"))
        written = [f"rng/rank-{rank:05d}.pt"]  # this rank's small files, their sizes go in the marker
        written += save_stream_state(states.data, progress["epoch"], progress["epoch_step"], staging)
        if rank == 0:
            with open(os.path.join(staging, "trainer_state.json"), "w", encoding="utf-8") as handle:
                # Checkpoints are shared and uploaded: no secret of the config in them (never read back).
                json.dump(redact_secrets(progress), handle, indent=1, default=str)
            torch.save(extras_of(states), os.path.join(staging, "extras.pt"))
            written += ["trainer_state.json", "extras.pt"]
            hparams_objects = states.hparams_objects() if states.hparams_objects is not None else None
            if hparams_objects:  # never read when resuming: load_from_checkpoint unpickles it
                torch.save(hparams_objects, os.path.join(staging, HPARAMS_FILE))
                written.append(HPARAMS_FILE)
        return written

    def _write(self, state: dict, staging: str) -> Any:
        """The sharded format's synchronous write (DCP)."""
        import torch.distributed.checkpoint as dcp

        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        return dcp.save(state, checkpoint_id=os.path.join(staging, "model_optim"), no_dist=not distributed.is_distributed())

    def _write_async(self, state: dict, staging: str, full: bool) -> Any:
        import torch.distributed.checkpoint as dcp

        if not full:
            # DCP copies the state to CPU here (staging), then writes in a thread.
            result = dcp.async_save(
                state, checkpoint_id=os.path.join(staging, "model_optim"), process_group=self._async_group,
                no_dist=not distributed.is_distributed(),
            )
            return getattr(result, "upload_completion", result)
        if distributed.rank() != 0:
            return None
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        return self._executor.submit(torch.save, _copy_tensors(state), os.path.join(staging, "model_optim.pt"))

    def poll(self) -> None:
        """Commit a finished background save (cheap; called after every step)."""
        if self._pending is not None and (self._pending[0] is None or self._pending[0].done()):
            self.wait()

    def wait(self) -> None:
        """Block until the in-flight async save (if any) is written, then hand its commit to rank 0's
        committer thread (``finish`` also waits for the commit)."""
        if self._pending is None:
            return
        future, staging, marker = self._pending
        self._pending = None
        try:
            result = future.result() if future is not None else None
        except save_failure.WRITE_ERRORS as error:
            raise save_failure.abandon(staging, self.root, *save_failure.failure(error, distributed.rank())) from error
        if distributed.rank() == 0:
            self._commit_in_background(staging, marker, self.config.format == "full", result)

    def finish(self) -> None:
        """Block until every save so far is written, committed and old checkpoints are deleted
        (rank 0; on the other ranks: written). Raises the commit's error, if it had one."""
        self.wait()
        self._join_commit()

    def _commit_in_background(self, staging: str, marker: dict, full: bool, result: Any) -> None:
        """Rank 0, once every rank's files are written: commit and apply retention in a thread.
        One commit at a time (the previous one is waited for), so ``latest`` only moves forward and
        staging folders cannot pile up behind a slow deletion."""
        self._join_commit()
        if self._committer is None:
            self._committer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-commit")
        future = self._committer.submit(self._commit, staging, marker, full, result)
        self._commit_future = (future, staging)
        layout.register_commit(self.root, future)

    def _join_commit(self) -> None:
        """Wait for rank 0's commit in flight; raise its error (naming the checkpoint) here."""
        if self._commit_future is None:
            return
        (future, staging), self._commit_future = self._commit_future, None
        try:
            future.result()
        except Exception as error:
            shutil.rmtree(staging, ignore_errors=True)  # what is left of it if the commit failed before its rename
            space = f"; {save_failure.space_on(self.root)}" if save_failure.is_disk_full(error) else ""
            raise CheckpointError(f"committing the checkpoint {staging} (or deleting old checkpoints after it) failed "
                                  f"({type(error).__name__}: {error}{space}); `latest` names the newest committed "
                                  "checkpoint") from error

    def _commit(self, staging: str, marker: dict, full: bool, result: Any) -> None:
        """The committer thread: sizes of rank 0's data files, then ``layout.commit``, then retention."""
        with layout.committing():
            marker[integrity.FILES].update(integrity.written_sizes(staging, full, result))
            # DCP fsynced its files; torch.save did not fsync the full format's one file.
            final = layout.commit(self.root, staging, marker, unsynced=("model_optim.pt",) if full else ())
            deleted = layout.apply_retention(
                self.root, self.config.keep_last, self.config.monitor, self.config.mode, self.config.keep_best
            )
        log.info("checkpoint committed: %s%s", final, f" (removed {len(deleted)} old)" if deleted else "")

    # ----- loading -------------------------------------------------------------------------------------------
    def load(self, path: str, states: RunStates) -> dict[str, Any]:
        """Restore model, optimizer, scheduler, precision, callbacks and (same world size) RNG states
        from the checkpoint at ``path`` into ``states``; returns the saved progress (the caller puts
        the run there). A collective."""
        self.finish()  # a save of this run still committing (rank 0)
        marker = layout.read_marker(path)
        if marker.get("weights_only"):
            raise CheckpointError(f"{marker.get('packed_from', path)} holds the model's weights only "
                                  "(ModelCheckpoint(save_weights_only=True)): resuming needs a full checkpoint; "
                                  "load these weights with load_from_checkpoint")
        integrity.verify(path, marker)  # every file there, with the size it was written with
        load_training_state(path, states.model, states.optimizer, marker["format"],
                            part_of_model=self.strategy.owns_step, strategy=self.strategy)
        extras = load_file(os.path.join(path, "extras.pt"))
        if states.scheduler is not None:
            states.scheduler.load_state_dict(extras.get("scheduler"))
        if states.precision is not None:
            states.precision.load_state_dict(extras.get("precision") or {})
        if states.callbacks is not None:
            states.callbacks.load_state_dict(extras.get("callbacks") or {})
        with open(os.path.join(path, "trainer_state.json"), encoding="utf-8") as handle:
            progress = json.load(handle)
        self._restore_rng(path, marker, states, progress["step"])
        return progress

    def _restore_rng(self, path: str, marker: dict, states: RunStates, step: int) -> None:
        """Each rank's generators as saved, when the run has the checkpoint's layout (world size and
        mesh: the same rank holds the same part of the model and reads the same samples); else seeded
        afresh from (seed, step, rank), so the streams from here differ from the ones the run started with."""
        rng_file = os.path.join(path, "rng", f"rank-{distributed.rank():05d}.pt")
        world, mesh = distributed.world_size(), mesh_layout(states.model)
        if marker["world_size"] == world and marker.get("mesh") == mesh and os.path.isfile(rng_file):
            set_rng_state(load_file(rng_file))
            return
        from trainer.runtime.seeding import derive_seed, seed_everything

        # (one stream per tensor-parallel group, as at the start: strategy.random_stream_rank)
        seed_everything(derive_seed(states.seed, "resume", step, self.strategy.random_stream_rank))
        if marker["world_size"] != world:
            log.info("resuming a %d-rank checkpoint on %d ranks: random generators re-seeded from (seed %d, step %d, "
                     "rank), not restored", marker["world_size"], world, states.seed, step)
        else:
            log.info("resuming a checkpoint of %s on %s: random generators re-seeded from (seed %d, step %d, rank), "
                     "not restored", describe_layout(marker["world_size"], marker.get("mesh")),
                     describe_layout(world, mesh), states.seed, step)
