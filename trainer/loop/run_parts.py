"""The parts of one rank's run: each built once, in ``build_run`` (every call) and ``build_fit``
(fit only), and read-only once installed.

A part is read as a plain attribute of the run (``run.strategy``, ``run.optimizer``): the step loop
reads several per step, and an attribute costs no call. Installing one twice, or assigning one, is an
error: the run's mutable state is its counters (``RunCounters``), its metrics and the stage it runs,
each with one owner (``RankRun``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.api.module import TrainModule
    from trainer.callbacks import CallbackList
    from trainer.checkpoint import CheckpointManager
    from trainer.data.user_loader import RunData
    from trainer.loggers import Logger
    from trainer.loop.hooks import RunHooks
    from trainer.loop.log_collector import LogCollector
    from trainer.optim.lr_scheduling import LRScheduling
    from trainer.precision import Precision
    from trainer.runtime.launch import ClusterEnvironment
    from trainer.strategies import Strategy
    from trainer.trainer import Trainer


class RunParts:
    """The named parts of a run, in the order they are built (see ``trainer/loop/run_build.py`` and
    ``trainer/loop/fit_build.py``). Until a fit's parts are built they read as None (an evaluation
    has none)."""

    # ----- given (RankRun.__init__) -------------------------------------------------------------------
    trainer: Trainer  # the configuration (never written during the run)
    module: TrainModule  # the user's module
    env: ClusterEnvironment  # how this process was launched
    strategy: Strategy
    own_log_handler: bool  # this rank set up its own log handler (no Hydra root handlers)
    # ----- build_run ----------------------------------------------------------------------------------
    device: Any
    rank: int
    data_parallel_size: int  # the ranks that load different samples (the gradient sync averages over them)
    data_rank: int  # which samples this rank loads
    run_dir: str  # rank 0's, the same on every rank
    hparams_archive: Any = None  # rank 0 of a fit that checkpoints: the pickled hyperparameter objects
    module_logs: LogCollector  # what self.log collects
    callbacks: CallbackList  # the Trainer's and configure_callbacks()'s, in call order
    hooks: RunHooks  # the one dispatcher of every hook
    precision: Precision
    data: RunData  # the data hooks' datasets and loaders (read again only by trainer/loop/data_reload.py)
    summary: Any = None  # the model summary (enable_model_summary)
    wrapped: Any = None  # what strategy.wrap returned: what a step calls (Lightning's trainer.model)
    loggers: list[Logger] = []  # rank 0's writers (none on the other ranks)
    # ----- build_fit ----------------------------------------------------------------------------------
    optimizer: Any = None  # one optimizer, or the list under manual optimization with several
    lr_scheduling: LRScheduling | None = None  # the schedulers and when they step
    manual: Any = None  # a ManualStep under automatic_optimization = False
    checkpoints: CheckpointManager | None = None
    fp16: Any = None  # fp16-mixed: the optimizer step's overflow handling
    nonfinite: Any = None  # trainer.nonfinite_loss=error: the late non-finite check
    throughput: Any = None
    breakdown: Any = None  # profile.wall_clock_breakdown's timer (a no-op when off)
    trace: Any = None  # profile.trace_steps' torch.profiler window
    comms: Any = None  # profile.comms_steps' log of collectives
    train_step: Any = None  # one optimizer step: a TrainStep, or the ManualStep's

    def install(self, **parts: Any) -> None:
        """Add built parts; each is installed once and read-only afterwards."""
        for name, value in parts.items():
            if name not in PART_NAMES:
                raise AttributeError(f"{name!r} is not a part of the run (see RunParts)")
            if name in self.__dict__:
                raise AttributeError(f"the run's {name!r} is already built")
            self.__dict__[name] = value

    def __setattr__(self, name: str, value: Any) -> None:
        if name in PART_NAMES:
            raise AttributeError(f"the run's {name!r} is a built part (read-only); parts are installed once by the build")
        object.__setattr__(self, name, value)


PART_NAMES = frozenset(RunParts.__annotations__)
