"""Where one rank's run stands: its counters, and the only code that changes them.

Every change of a counter is one of `RunCounters`' methods, called by the loop at the point the
pseudocode in trainer/api/module.py names; everything else (the run view, the Trainer's properties,
the checkpoint's progress) reads them.

Units: ``step`` counts global batches (the logged step axis, checkpoint names, the data position),
``epoch`` the epochs finished (0-based while the first runs), ``epoch_step`` the optimizer steps of
the current epoch, ``batch_idx`` the micro-batches run in it (``training_step``'s argument), and
``global_step`` optimizer steps: ``step`` under automatic optimization, the module's ``opt.step()``
calls under manual optimization (Lightning's unit).
"""

from __future__ import annotations


class RunCounters:
    """The run's counters (read freely; changed only by these methods). The loop's run is one
    (``RankRun`` subclasses it), so reading a counter costs an attribute lookup, not a call. The
    methods the step loop calls write the instance's ``__dict__`` directly: the run refuses writes to
    its parts in ``__setattr__``, which the counters need not pay for on every step."""

    def __init__(self) -> None:
        self.step = 0
        self.epoch = 0
        self.epoch_step = 0
        self.batch_idx = 0
        self.optimizer_steps: int | None = None  # manual optimization only: the module's opt.step() calls
        self._stepped = 0  # 1 from the optimizer step (manual: training_step's return) until the global batch is done

    @property
    def global_step(self) -> int:
        return self.step + self._stepped if self.optimizer_steps is None else self.optimizer_steps

    # ----- training --------------------------------------------------------------------------------------
    def start_epoch(self, accumulate_grad_batches: int) -> None:
        """An epoch (or the rest of one after a resume) begins: micro-batches count from its position."""
        self.batch_idx = self.epoch_step * accumulate_grad_batches

    def micro_batch_done(self) -> None:
        self.__dict__["batch_idx"] += 1

    def count_optimizer_calls(self) -> None:
        """Manual optimization: from now on ``global_step`` counts the module's ``opt.step()`` calls."""
        self.optimizer_steps = 0

    def optimizer_called(self) -> None:
        """The module called ``opt.step()`` (manual optimization; an fp16-skipped step counts too)."""
        self.__dict__["optimizer_steps"] += 1

    def optimizer_stepped(self) -> None:
        """The optimizer of the current global batch stepped (automatic optimization; an fp16-skipped
        step too): ``global_step`` counts it from here, as Lightning's does in ``on_train_batch_end``."""
        self.__dict__["_stepped"] = 1

    def batch_trained(self) -> None:
        """Manual optimization: the global batch's ``training_step`` returned (its ``opt.step()`` calls are
        counted already); a checkpoint saved from here (``on_train_batch_end``) holds it as trained."""
        self.__dict__["_stepped"] = 1

    def step_done(self) -> None:
        """A global batch (one optimizer step under automatic optimization) was trained."""
        counters = self.__dict__
        counters["_stepped"] = 0
        counters["step"] += 1
        counters["epoch_step"] += 1

    def epoch_done(self) -> None:
        self.epoch += 1
        self.epoch_step = 0

    # ----- restoring ------------------------------------------------------------------------------------
    def resume(self, step: int, epoch: int, epoch_step: int, global_step: int | None) -> None:
        """Continue training where a checkpoint left it. A run that counts optimizer calls goes on
        from the saved ``global_step`` (a checkpoint older than that field: from the batches)."""
        self.step, self.epoch, self.epoch_step = step, epoch, epoch_step
        if self.optimizer_steps is not None:
            self.optimizer_steps = global_step if global_step is not None else step

    def show(self, step: int, global_step: int | None, epoch: int | None = None) -> None:
        """Validate / test / predict: stand where the fitted weights were trained (``global_step``
        different from ``step``: a manual-optimization run's count)."""
        self.step = step
        if epoch is not None:
            self.epoch = epoch
        self.optimizer_steps = global_step if global_step not in (None, step) else None
