"""The optimizer and learning-rate scheduler groups of `LightningCLI`: a group added with
``link_to="AUTOMATIC"`` becomes the model's ``configure_optimizers`` (`ConfiguredOptimizers`); one
with ``link_to="model.<arg>"`` is handed to that model argument (`link_optimizers`), as in Lightning."""

from __future__ import annotations

from typing import Any, Callable

from jsonargparse import Namespace
from torch.optim import Optimizer

from trainer.lightning.cli_parser import LightningArgumentParser, LRSchedulerTypeTuple, instantiate_class
from trainer.lightning.utilities.exceptions import MisconfigurationException


def class_init(registered: Any, init: Any) -> dict[str, Any]:
    """``{"class_path": ..., "init_args": {...}}`` of a group's parsed value: a group of one class
    (``registered`` a class) holds its arguments only, a group of several holds its class path."""
    init = init.as_dict() if isinstance(init, Namespace) else dict(init or {})
    if isinstance(registered, tuple):
        return init
    return {"class_path": f"{registered.__module__}.{registered.__name__}", "init_args": init}


def link_optimizers(parser: LightningArgumentParser) -> None:
    """Link each optimizer / scheduler group whose ``link_to`` is a key (not "AUTOMATIC") to that key:
    the model argument receives ``{"class_path": ..., "init_args": ...}``."""
    for key, (registered, link_to) in {**parser._optimizers, **parser._lr_schedulers}.items():
        if link_to == "AUTOMATIC":
            continue
        if isinstance(registered, tuple):
            parser.link_arguments(key, link_to)
        else:
            parser.link_arguments(key, link_to, compute_fn=_ClassPathAdder(registered))


class _ClassPathAdder:
    """A link's ``compute_fn``: a one-class group's arguments with that class's path."""

    def __init__(self, registered: type) -> None:
        self.registered = registered

    def __call__(self, init_args: Any) -> dict[str, Any]:
        return class_init(self.registered, init_args)


def automatic_optimizer_keys(parser: LightningArgumentParser, cli_name: str) -> tuple[str, str | None] | None:
    """The keys of the AUTOMATIC optimizer group and scheduler group (or None), None when there is no
    AUTOMATIC optimizer group; more than one of either is an error (link them and write
    ``configure_optimizers`` yourself)."""

    def automatic(register: dict[str, tuple[Any, str]], base: Any) -> list[str]:
        return [key for key, (registered, link_to) in register.items() if link_to == "AUTOMATIC" and any(
            issubclass(c, base) for c in (registered if isinstance(registered, tuple) else (registered,)))]

    optimizers = automatic(parser._optimizers, Optimizer)
    schedulers = automatic(parser._lr_schedulers, LRSchedulerTypeTuple)
    if not optimizers:
        return None
    if len(optimizers) > 1 or len(schedulers) > 1:
        raise MisconfigurationException(
            f"{cli_name}: at most one optimizer and one lr_scheduler group may be 'AUTOMATIC', found "
            f"{optimizers + schedulers}; add the others with link_to='model.<argument>' and write the model's "
            "configure_optimizers")
    return optimizers[0], schedulers[0] if schedulers else None


class ConfiguredOptimizers:
    """The model's ``configure_optimizers`` when ``--optimizer`` is given: builds the optimizer over
    the model's parameters (and the scheduler over it) when called, on whichever process trains, and
    returns ``configure(model, optimizer, lr_scheduler)`` (the CLI's ``configure_optimizers``)."""

    def __init__(self, model: Any, configure: Callable[..., Any], optimizer_init: dict[str, Any],
                 scheduler_init: dict[str, Any] | None) -> None:
        self.model = model
        self.configure = configure
        self.optimizer_init = optimizer_init
        self.scheduler_init = scheduler_init
        self.__wrapped__ = configure  # (what overrides the model's method, for introspection)

    def __call__(self) -> Any:
        optimizer = instantiate_class(self.model.parameters(), self.optimizer_init)
        scheduler = instantiate_class(optimizer, self.scheduler_init) if self.scheduler_init else None
        return self.configure(self.model, optimizer=optimizer, lr_scheduler=scheduler)
