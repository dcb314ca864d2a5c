"""A Lightning callback that records every Callback hook the trainer calls, with its scalar arguments,
into a :class:`~tests.support.lightning_trace.TraceSink`; at the hooks of
:data:`~tests.support.lightning_trace.VALUE_HOOKS` it also takes ``trainer.callback_metrics`` (and the
loss a training step returned)."""

from lightning.pytorch import Callback

from tests.support.lightning_trace import (
    CALLBACK_HOOKS, VALUE_HOOKS, TraceSink, callback_signature, metrics_snapshot, returned_loss,
    scalar_arguments,
)


def _recording_hook(name):
    # arguments are named as Lightning names them, whichever Callback class this file imports
    signature = callback_signature(name)

    def hook(self, *args, **kwargs):
        self.sink.record("callback", name, scalar_arguments(signature, (self, *args), kwargs))
        if name in VALUE_HOOKS:
            try:
                bound = signature.bind(self, *args, **kwargs).arguments
            except TypeError:  # (the call record above says how it was called)
                bound = {}
            values = metrics_snapshot(getattr(bound.get("trainer"), "callback_metrics", None))
            if name == "on_train_batch_end":
                loss = returned_loss(bound.get("outputs"))
                if loss is not None:
                    values["<returned loss>"] = loss
            self.sink.record_values(name, values)
        # the base class's hooks do nothing (their shapes may differ between the two: not called)
        return {} if name == "state_dict" else None

    # Lightning's signature (a trainer may look at a hook's parameters), but not Lightning's code:
    # the hook counts as defined by this callback.
    hook.__name__ = hook.__qualname__ = name
    hook.__signature__ = signature
    return hook


class HookTracer(Callback):
    """Records every Callback hook into ``sink`` (role ``"callback"``)."""

    def __init__(self, sink: TraceSink):
        super().__init__()
        self.sink = sink

    for _name in CALLBACK_HOOKS:
        locals()[_name] = _recording_hook(_name)
    del _name
