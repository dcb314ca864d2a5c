"""The callbacks of one run: calls their hooks in order, collects stop requests and agrees on them
across ranks, and gathers their checkpoint state."""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Sequence

from trainer.runtime import distributed
from trainer.api.callback import Callback, attach_module
from trainer.api.hook_table import CALLBACKS, MODULE
from trainer.api.run_view import RunView
from trainer.callbacks.hook_shapes import check_hook_shapes
from trainer.api.lightning_hooks import refuse_unknown_hooks

log = logging.getLogger(__name__)

#: where the dict that ``on_save_checkpoint`` hooks filled is kept among the callbacks' states
CHECKPOINT_KEY = "__on_save_checkpoint__"
#: where the datamodule's ``state_dict()`` is kept among them
DATAMODULE_KEY = "__datamodule__"


def check_callbacks(callbacks: Callback | Sequence[Callback] | None) -> list[Callback]:
    """``Trainer(callbacks=...)`` as a list: None, one Callback, or a sequence of them."""
    if callbacks is None:
        return []
    if isinstance(callbacks, Callback):
        return [callbacks]
    if isinstance(callbacks, (str, bytes)) or not isinstance(callbacks, Iterable):
        raise TypeError(f"trainer callbacks must be a list of Callback instances, got {callbacks!r}")
    items = list(callbacks)
    for item in items:
        if not isinstance(item, Callback):
            raise TypeError(
                f"trainer callbacks: {item!r} ({type(item).__name__}) is not a Callback; "
                "subclass trainer.callbacks.Callback"
            )
        refuse_unknown_hooks(item, Callback, "Callback")
        check_hook_shapes(item, Callback)
    return items


class CallbackList:
    """The run's callbacks (in the order given) and the run's stop request."""

    def __init__(self, callbacks: Sequence[Callback], trainer: Any = None, module: Any = None,
                 view: RunView | None = None):
        self.callbacks = list(callbacks)
        for callback in self.callbacks:
            attach_module(callback, module)
        self.trainer = trainer  # the hooks' leading (trainer, module)
        self.module = module
        self.view = view  # where the run stands, for the checkpoint hooks' step and epoch
        #: (who asked, why) once a stop was requested; after ``should_stop`` the same on every rank
        self.stop: tuple[str, str] | None = None
        self._waiting = False  # a stop was asked for before min_epochs / min_steps (logged once)
        self._agreed = False  # every rank learnt the stop request (should_stop): not gathered again
        self._calling: Callback | None = None  # whose hook runs now: names the requester in the log
        self._hooks: Any = None  # the run's hook dispatcher (dispatch_with): calls the checkpoint hooks

    def dispatch_with(self, hooks: Any) -> None:
        """The run's hook dispatcher (``trainer/loop/hooks.py``): the checkpoint hooks are called
        through it, like every other hook, in the order of its table."""
        self._hooks = hooks

    def add_configured(self, configured: Any) -> None:
        """Add what the module's ``configure_callbacks()`` returned (a Callback or a list): each replaces
        the Trainer's callbacks of its class (Lightning's rule); metric watchers stay last."""
        if not configured:
            return
        added = check_callbacks(configured)
        for callback in added:
            attach_module(callback, self.module)
        types = {type(callback) for callback in added}
        kept = [callback for callback in self.callbacks if type(callback) not in types]
        combined = kept + added
        self.callbacks = ([c for c in combined if not c.watches_metrics] + [c for c in combined if c.watches_metrics])

    # ----- stopping --------------------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        """Record a stop request (the first one wins); acted on at the end of the step."""
        if self.stop is None:
            who = type(self._calling).__name__ if self._calling is not None else "user code"
            self.stop = (who, str(reason))

    @property
    def stopping(self) -> bool:
        return self.stop is not None

    def should_stop(self, step: int, may_stop: Callable[[], bool] | None = None) -> bool:
        """At the end of ``step``, on every rank: whether training stops here, the same answer on
        every rank. Makes a collective only on steps where a callback's decision may differ
        between ranks (``Callback.stop_needs_agreement``), none otherwise. ``may_stop()`` False
        (``min_epochs`` / ``min_steps`` not reached; asked only once a stop was requested): a stop asked
        for waits, and training goes on."""
        requested = self.stop is not None
        # (once agreed, a stop stays agreed: asked again at the next epoch's start, no collective)
        if not self._agreed and self.callbacks and any(callback.stop_needs_agreement(step) for callback in self.callbacks):
            if not distributed.any_rank(requested):
                return False
            # Once per run: learn who asked, also on the ranks that did not.
            requests = distributed.all_gather_object(self.stop)
            rank, (who, reason) = next((r, s) for r, s in enumerate(requests) if s is not None)
            self.stop = (who if rank == distributed.rank() else f"{who} on rank {rank}", reason)
            self._agreed = True
        elif not requested:
            return False
        if may_stop is not None and not may_stop():
            if not self._waiting:
                self._waiting = True
                log.info("%s asked to stop at step %d (%s), but trainer.min_epochs / min_steps is not reached: training "
                         "continues", self.stop[0], step, self.stop[1])
            return False
        log.info("%s stopped training at step %d: %s", self.stop[0], step, self.stop[1])
        return True

    # ----- checkpoints ----------------------------------------------------------------------------------
    def _keys(self) -> list[str]:
        """Each callback's ``state_key``; repeats get ``#2``, ``#3`` ... in the order given."""
        keys: list[str] = []
        for callback in self.callbacks:
            key, n = callback.state_key, 1
            while key in keys:
                n += 1
                key = f"{callback.state_key}#{n}"
            keys.append(key)
        return keys

    def state_dict(self) -> dict[str, Any]:
        """Each callback's ``state_dict()``, the datamodule's, and the dict the ``on_save_checkpoint``
        hooks filled (the callbacks', then the module's; called on rank 0 for a checkpoint folder, on
        every rank for a ``.ckpt`` file, as Lightning, rank 0's kept)."""
        states = {key: callback.state_dict() for key, callback in zip(self._keys(), self.callbacks)}
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is not None and (datamodule_state := datamodule.state_dict()):  # (kept when not empty)
            states[DATAMODULE_KEY] = datamodule_state
        if self._hooks is not None and self.view is not None:
            checkpoint = {"step": self.view.step, "epoch": self.view.epoch}
            self._hooks.call("on_save_checkpoint", checkpoint)  # the callbacks', then the module's
            states[CHECKPOINT_KEY] = checkpoint
        return states

    def load_state_dict(self, states: dict[str, Any]) -> None:
        """On resume, every rank, in Lightning's order: the module's ``on_load_checkpoint``, the
        datamodule's ``load_state_dict``, the callbacks' ``on_load_checkpoint``, their ``load_state_dict``."""
        states = dict(states)
        checkpoint = states.pop(CHECKPOINT_KEY, None)
        datamodule_state = states.pop(DATAMODULE_KEY, None)
        if self._hooks is not None:
            self._hooks.call_receiver("on_load_checkpoint", MODULE, checkpoint or {})
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is not None and datamodule_state is not None:
            datamodule.load_state_dict(datamodule_state)
        if self._hooks is not None:
            self._hooks.call_receiver("on_load_checkpoint", CALLBACKS, checkpoint or {})
        keys = self._keys()
        for key, callback in zip(keys, self.callbacks):
            if states.get(key):  # an empty state is not given back (as Lightning)
                callback.load_state_dict(states[key])
            elif key in states:
                continue
            else:
                log.info("the checkpoint has no state for callback %s: it starts fresh", key)
        unused = sorted(set(states) - set(keys))
        if unused:
            log.info("the checkpoint holds state of callbacks this run does not have: %s", unused)
