"""The one place a run calls its notification hooks: ``run.hooks.call(name, *args)`` calls the
receivers the table in ``trainer/api/hook_table.py`` names (callbacks with ``(trainer, module, *args)``,
the module and the datamodule with ``*args``), in its order.

Only overrides are called: a receiver whose hook is the base class's no-op is left out when the
hook's list is first built, so a hook nobody overrides costs one dict lookup per call on the hot path.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable

from trainer.api.callback import Callback
from trainer.api.datamodule import DataModule, setup_datamodule
from trainer.api.hook_calls import call_module_hook, call_with_stage
from trainer.api.hook_table import BEHAVIOUR_HOOKS, CALLBACKS, DATAMODULE, MODULE, OPTIONAL_LAST_ARGUMENT, RECEIVERS
from trainer.api.lightning_hooks import defines_own, overrides
from trainer.api.module import TrainModule

if TYPE_CHECKING:
    from trainer.callbacks.callback_list import CallbackList


def _takes(method: Callable, count: int) -> bool:
    try:
        inspect.signature(method).bind(*([None] * count))
    except TypeError:
        return False
    except ValueError:  # no signature to read: called as given
        return True
    return True


class RunHooks:
    """The hooks of one call (fit, validate, test or predict) on one rank."""

    def __init__(self, trainer: Any, module: TrainModule, datamodule: DataModule | None, callbacks: CallbackList):
        self.trainer, self.module, self.datamodule, self.callbacks = trainer, module, datamodule, callbacks
        self._calls: dict[str, list[Callable[..., Any]]] = {}
        #: which object's batch transfer hooks run (the datamodule's where it overrides them, as Lightning)
        self.transfer = {name: self._transfer_owner(name) for name in BEHAVIOUR_HOOKS if "batch" in name}
        self._overridden = {name: overrides(module, TrainModule, name) for name in BEHAVIOUR_HOOKS}
        #: the module's on_train_batch_start may return -1 (skip the rest of the epoch): its return is read
        self.module_batch_start = overrides(module, TrainModule, "on_train_batch_start")
        #: the transfer hooks' owners (before, transfer, after); all None: the loop's own move to the device
        self.transfer_owners = tuple(self.transfer[name] for name in
                                     ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer"))
        self.default_transfer = not any(self.transfer_owners)
        #: the hooks somebody overrides: the hot path tests ``name in hooks.active`` before calling
        self.active = frozenset(name for name in RECEIVERS if self._build(name, None))

    def _transfer_owner(self, name: str) -> Any:
        if self.datamodule is not None and defines_own(self.datamodule, DataModule, name):
            return self.datamodule
        return self.module if overrides(self.module, TrainModule, name) else None

    def module_overrides(self, name: str) -> bool:
        """Whether the module overrides the behaviour hook ``name`` (else the loop's fast path does the same)."""
        return self._overridden[name]

    def call(self, name: str, *args: Any) -> Any:
        """Call hook ``name`` on its receivers, in the table's order; returns what the last one returned
        (the module's, where it receives the hook last)."""
        calls = self._calls.get(name)
        if calls is None:
            calls = self._calls[name] = self._build(name, len(args))
        result = None
        for call in calls:
            result = call(*args)
        return result

    def call_receiver(self, name: str, receiver: str, *args: Any) -> None:
        """Hook ``name`` on one of its receivers only (``MODULE`` or ``CALLBACKS``: where another step
        comes between the two, as the datamodule's state between the ``on_load_checkpoint`` hooks)."""
        if receiver not in RECEIVERS[name]:
            raise ValueError(f"{receiver} does not receive {name} (trainer/api/hook_table.py)")
        for call in self._build(name, len(args), only=receiver):
            call(*args)

    def call_module(self, name: str, *args: Any) -> Any:
        """A module hook whose default does the work (the model-mode hooks: ``on_validation_model_eval``
        puts the module in eval mode): called on the module whether it overrides it or not."""
        return call_module_hook(self.module, name, *args)

    def any(self, name: str) -> bool:
        """Whether anybody overrides hook ``name`` (to skip work done only for it)."""
        return name in self.active

    def call_callbacks(self, name: str, *args: Any, watching: bool) -> None:
        """``name`` on the callbacks that watch metrics (``watching``) or on the others only (the two
        halves around the module's ``on_train_epoch_end``)."""
        for callback in self.callbacks.callbacks:
            if bool(callback.watches_metrics) == watching and overrides(callback, Callback, name):
                self._callback_call(callback, name, len(args))(*args)

    def _build(self, name: str, count: int | None, only: str | None = None) -> list[Callable[..., Any]]:
        calls: list[Callable[..., Any]] = []
        for receiver in RECEIVERS[name] if only is None else (only,):
            if receiver == CALLBACKS:
                calls += [self._callback_call(callback, name, count) for callback in self.callbacks.callbacks
                          if overrides(callback, Callback, name)]
            elif receiver == MODULE and overrides(self.module, TrainModule, name):
                calls.append(self._adapted(getattr(self.module, name), name, count))
            elif receiver == DATAMODULE and self.datamodule is not None and overrides(self.datamodule, DataModule, name):
                if name == "setup":  # under the seed every rank shares for it (trainer/api/datamodule.py)
                    datamodule, seed = self.datamodule, self.trainer.seed
                    calls.append(lambda stage: setup_datamodule(datamodule, stage, seed))
                else:
                    calls.append(self._adapted(getattr(self.datamodule, name), name, count))
        return calls

    def _callback_call(self, callback: Callback, name: str, count: int | None) -> Callable[..., Any]:
        method = self._adapted(getattr(callback, name), name, None if count is None else count + 2)
        trainer, module, callbacks = self.trainer, self.module, self.callbacks

        def call(*args: Any) -> Any:
            callbacks._calling = callback  # names the callback if it requests a stop
            try:
                return method(trainer, module, *args)
            finally:
                callbacks._calling = None
        return call

    @staticmethod
    def _adapted(method: Callable, name: str, count: int | None) -> Callable[..., Any]:
        """``method``, or for an override of Lightning's shape of a hook with an argument of ours
        (``on_train_epoch_end(self)``), ``method`` called without that last argument."""
        if name in ("setup", "teardown"):  # the stage as a keyword where the hook takes one (as Lightning)
            return lambda *args: call_with_stage(method, *args)
        if name in OPTIONAL_LAST_ARGUMENT and count and not _takes(method, count) and _takes(method, count - 1):
            return lambda *args: method(*args[:-1])
        return method
