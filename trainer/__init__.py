"""A PyTorch training framework: ``Trainer`` runs a ``TrainModule`` with a strategy plugin.

Where things live (one job a file; the subpackages' docstrings list their own files):

- The user's side: ``module.py`` (``TrainModule``, its hooks and where each fires), ``module_log_api.py``
  (``self.log`` / ``self.log_dict``), ``module_logging.py`` (collecting and reducing what they log),
  ``module_hooks.py`` (hooks taking Lightning's shapes), ``manual_optimization.py``, ``hparams.py``
  (``save_hyperparameters``), ``load_checkpoint.py`` (``load_from_checkpoint``), ``datamodule.py``,
  ``run_state.py`` (``global_step``, ``current_epoch`` ... on module and trainer).
- The entry points: ``trainer.py`` (``Trainer``: arguments, launching), ``trainer_arguments.py`` (the
  checks of its plain arguments), ``run_limits.py`` (Lightning's run-length arguments), ``step_limits.py`` (when a
  run stops: ``max_steps`` against ``global_step``),
  ``lightning_names.py`` / ``lightning_hooks.py`` (Lightning's names we take, and the hooks we refuse),
  ``entry_points.py`` (what ``fit`` / ``validate`` / ``test`` / ``predict`` check first),
  ``weights_return.py`` (what the caller gets back from spawned workers), ``cli.py`` / ``cli_errors.py``
  (Hydra's ``train.py``).
- One rank's run: ``loop.py`` (set-up and the training loop), ``train_step.py`` (one optimizer step,
  in the pseudocode's order), ``loss_normalization.py`` (mean / tokens), ``step_accounting.py`` (token counts,
  the non-finite check), ``token_weights.py``, ``optimizers.py`` (what ``configure_optimizers`` may
  return), ``param_groups.py`` (loading optimizer state without replacing its param-group dicts), ``lr_scheduling.py`` / ``schedules.py``, ``validation.py``, ``sanity_check.py``,
  ``evaluation.py`` (test / predict), ``metrics.py`` (device-side sums reduced on logging steps).
- Data: ``data.py`` (global-batch plans), ``seeding.py``, ``loaders.py`` (batches loaded under
  position-keyed seeds), ``validation_shard.py``, ``permutation.py`` (the epoch's order per position), ``user_loader.py`` (the module's data hooks and DataLoaders),
  ``streaming/`` (iterable datasets: the shard protocol, ``data.stream_mode``, the stream's checkpoint position).
- Processes: ``launch.py`` (torchrun, SLURM, spawning), ``distributed.py`` (process groups, the
  trainer's collectives), ``elastic.py`` (torchrun restarts), ``rank_logging.py``.
- Model set-up: ``strategies/`` (single, DDP, FSDP, pipeline; the registry; the
  pipeline's parts), ``wrap_policy.py`` (FSDP units), ``weight_init.py`` (meta-device
  materialisation), ``speedups.py`` (activation checkpointing, compile), ``sync_batchnorm.py``,
  ``precision/``, ``tensors.py`` (batch moving, DTensor views).
- Saving: ``checkpoint/`` (formats, atomic commits, resume, consolidation).
- Watching: ``loggers/`` (metric sinks), ``callbacks/``, ``progress.py`` (progress bars),
  ``throughput.py``, ``profiling.py``, ``comms_log.py``, ``memory.py``, ``model_summary.py``,
  ``redact_files.py`` (no secrets in Hydra's files).
- Planning: ``batch_size_finder.py`` (``trainer.auto_batch_size``: the largest micro-batch that fits),
  ``batch_size_trial.py`` (one measured trial step, the run's state put back), ``peak_memory.py``
  (peak tensor memory: a dispatch-mode meter on CPU, ``max_memory_allocated`` on CUDA), ``estimate/``
  (``python -m trainer.estimate``: per-rank memory of a config, every strategy).
"""

from trainer.data import seed_everything
from trainer.datamodule import DataModule
from trainer.distributed import rank_zero_first
from trainer.module import TrainModule
from trainer.streaming import ShardedIterable
from trainer.trainer import Trainer

__all__ = ["DataModule", "ShardedIterable", "Trainer", "TrainModule", "rank_zero_first", "seed_everything"]
__version__ = "0.1.0"
