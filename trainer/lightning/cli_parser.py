"""``LightningArgumentParser``: a jsonargparse parser that adds this trainer's Lightning classes
(Trainer, LightningModule, LightningDataModule, Callback), optimizers and learning-rate schedulers as
argument groups, as Lightning's parser does, so that a Lightning program's config files and command
lines parse here unchanged.

Class paths written for Lightning name Lightning's modules (``lightning.pytorch.callbacks.EarlyStopping``,
``pytorch_lightning.loggers.CSVLogger``); the parser reads them as the mirror's
(``trainer.lightning.callbacks.EarlyStopping``), in config files and on the command line
(`mirror_class_path`). A short callback name (``--trainer.callbacks+=EarlyStopping``) is the mirror's
class of that name (this trainer's own ``trainer.callbacks`` has classes of the same names).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Sequence, Union

import torch
import yaml
from jsonargparse import ArgumentParser, Namespace, class_from_function, set_dumper, set_loader
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from trainer.api.callback import Callback
from trainer.api.datamodule import DataModule
from trainer.api.module import TrainModule
from trainer.lightning.utilities.exceptions import MisconfigurationException
from trainer.trainer import Trainer as _BaseTrainer

#: the jsonargparse parser mode of `LightningArgumentParser`: yaml, with Lightning's class paths read as the mirror's
MIRROR_MODE = "lightning_mirror_yaml"

#: a Lightning module path: ``lightning.pytorch.X``, ``pytorch_lightning.X``, ``lightning.X`` (-> ``trainer.lightning.X``)
_LIGHTNING_PATH = re.compile(r"^(?:lightning\.pytorch|pytorch_lightning|lightning)\.([A-Za-z_][\w.]*)$")
#: the mirror modules whose classes a short class name means first
_SHORT_NAME_MODULES = ("trainer.lightning.callbacks", "trainer.lightning.loggers")
#: command-line keys whose value is a class path (a callback, a logger)
_CLASS_KEYS = re.compile(r"^--[\w.]*(?:callbacks|logger|class_path)(?:\+)?$")


class ReduceLROnPlateau(torch.optim.lr_scheduler.ReduceLROnPlateau):
    """torch's ``ReduceLROnPlateau`` with the metric it watches (``monitor``), so that the CLI's
    ``configure_optimizers`` can return it with its ``monitor`` (Lightning's class of this name)."""

    def __init__(self, optimizer: Optimizer, monitor: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(optimizer, *args, **kwargs)
        self.monitor = monitor


LRSchedulerTypeTuple = (LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
LRSchedulerTypeUnion = Union[LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau]
LRSchedulerType = Union[type[LRScheduler], type[torch.optim.lr_scheduler.ReduceLROnPlateau]]
OptimizerCallable = Callable[[Iterable], Optimizer]
LRSchedulerCallable = Callable[[Optimizer], Union[LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau]]
ArgsType = Union[list[str], dict[str, Any], Namespace, None]


def mirror_class_path(value: str) -> str:
    """``value`` as the mirror names it: a Lightning module path becomes ``trainer.lightning``'s, a
    short name of a mirror callback / logger its full path; anything else is returned as is."""
    match = _LIGHTNING_PATH.match(value)
    if match:
        rest = match.group(1)
        return "trainer.lightning." + (rest[len("pytorch."):] if rest.startswith("pytorch.") else rest)
    if value.isidentifier():
        import importlib

        for module in _SHORT_NAME_MODULES:
            if isinstance(getattr(importlib.import_module(module), value, None), type):
                return f"{module}.{value}"
    return value


def _mirror_paths(data: Any, key: str | None = None) -> Any:
    """``data`` (a loaded config) with each Lightning class path, and each short class name under a
    ``class_path`` key, rewritten by `mirror_class_path`."""
    if isinstance(data, dict):
        return {k: _mirror_paths(v, k) for k, v in data.items()}
    if isinstance(data, list):
        return [_mirror_paths(v, key) for v in data]
    if isinstance(data, str) and (key == "class_path" or _LIGHTNING_PATH.match(data)):
        return mirror_class_path(data)
    return data


def _load(text: str) -> Any:
    return _mirror_paths(yaml.safe_load(text))


def _dump(data: Any) -> str:
    return yaml.safe_dump(data, default_flow_style=False, allow_unicode=True, sort_keys=False)


set_loader(MIRROR_MODE, _load, (yaml.YAMLError,))
set_dumper(MIRROR_MODE, _dump)


def mirror_args(args: Sequence[str]) -> list[str]:
    """Command-line tokens with the class paths of callbacks, loggers and ``class_path`` keys
    (``--trainer.callbacks+=lightning.pytorch.callbacks.EarlyStopping``) read by `mirror_class_path`."""
    out: list[str] = []
    for index, token in enumerate(args):
        if token.startswith("--") and "=" in token:
            key, value = token.split("=", 1)
            if _CLASS_KEYS.match(key) or _LIGHTNING_PATH.match(value):
                token = f"{key}={mirror_class_path(value)}"
        elif index and _CLASS_KEYS.match(args[index - 1]) or _LIGHTNING_PATH.match(token):
            token = mirror_class_path(token)
        out.append(token)
    return out


class LightningArgumentParser(ArgumentParser):
    """jsonargparse's ``ArgumentParser`` with Lightning's additions: `add_lightning_class_args`,
    `add_optimizer_args`, `add_lr_scheduler_args`; environment variables prefixed ``PL_`` when
    ``default_env=True``; Lightning's class paths read as the mirror's (the module docstring)."""

    def __init__(self, *args: Any, description: str = "Lightning Trainer command line tool", env_prefix: str = "PL",
                 default_env: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("parser_mode", MIRROR_MODE)
        super().__init__(*args, description=description, env_prefix=env_prefix, default_env=default_env, **kwargs)
        #: the keys of the callbacks added with `add_lightning_class_args` (the CLI appends them to the Trainer's)
        self.callback_keys: list[str] = []
        #: nested key -> (optimizer class or classes, link_to)
        self._optimizers: dict[str, tuple[Any, str]] = {}
        #: nested key -> (scheduler class or classes, link_to)
        self._lr_schedulers: dict[str, tuple[Any, str]] = {}

    def parse_args(self, args: Sequence[str] | None = None, *more: Any, **kwargs: Any) -> Namespace:
        """jsonargparse's ``parse_args`` with Lightning class paths in ``args`` read as the mirror's."""
        if args is not None:
            args = mirror_args(list(args))
        else:
            import sys

            args = mirror_args(sys.argv[1:])
        return super().parse_args(args, *more, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> Any:
        """jsonargparse's error, with this trainer's advice for a Trainer argument it does not take
        (Lightning's ``profiler``, ``plugins`` ... : what to use instead; a typo: the closest names)."""
        return super().error(message + trainer_argument_advice(message), ex)

    def add_lightning_class_args(self, lightning_class: Any, nested_key: str, subclass_mode: bool = False,
                                 required: bool = True) -> list[str]:
        """Add the arguments of ``lightning_class`` (a Trainer, LightningModule, LightningDataModule or
        Callback class, or a function returning one) under ``nested_key``; ``subclass_mode``: any subclass,
        given by ``class_path``. Returns the keys added."""
        if callable(lightning_class) and not isinstance(lightning_class, type):
            lightning_class = class_from_function(lightning_class)
        accepted = (_BaseTrainer, TrainModule, DataModule, Callback)
        if not (isinstance(lightning_class, type) and issubclass(lightning_class, accepted)):
            raise MisconfigurationException(
                f"add_lightning_class_args({lightning_class!r}, {nested_key!r}): give a subclass of Trainer, "
                "LightningModule, LightningDataModule or Callback (trainer.lightning's)")
        if issubclass(lightning_class, Callback):
            self.callback_keys.append(nested_key)
        if subclass_mode:
            return self.add_subclass_arguments(lightning_class, nested_key, fail_untyped=False, required=required)
        added = self.add_class_arguments(lightning_class, nested_key, fail_untyped=False, sub_configs=True,
                                         instantiate=not issubclass(lightning_class, _BaseTrainer))
        if issubclass(lightning_class, _BaseTrainer):
            self._plain_defaults(nested_key)
        return added

    def _plain_defaults(self, nested_key: str) -> None:
        """A Trainer argument whose default is an object a config file cannot hold (the ``checkpoint``
        default "Lightning's checkpointing") defaults to None here: not given, the Trainer's default
        (the CLI leaves arguments at their parser default to the Trainer)."""
        group = self.get_defaults().get(nested_key)
        if group is None:
            return
        unset = {f"{nested_key}.{key}": None for key, value in vars(group).items() if not _plain(value)}
        if unset:
            self.set_defaults(unset)

    def add_optimizer_args(self, optimizer_class: Any = (Optimizer,), nested_key: str = "optimizer",
                           link_to: str = "AUTOMATIC") -> None:
        """Add an optimizer's arguments (all but ``params``) under ``nested_key``: one class, or a tuple
        of base classes of which ``--optimizer`` picks one. ``link_to="AUTOMATIC"``: the CLI builds the
        model's ``configure_optimizers`` from it; else the key it is linked to (a model argument)."""
        self._add_optimizer_like(optimizer_class, Optimizer, nested_key, link_to, "params", self._optimizers)

    def add_lr_scheduler_args(self, lr_scheduler_class: Any = LRSchedulerTypeTuple, nested_key: str = "lr_scheduler",
                              link_to: str = "AUTOMATIC") -> None:
        """Add a learning-rate scheduler's arguments (all but ``optimizer``) under ``nested_key``, as
        `add_optimizer_args` does for an optimizer."""
        self._add_optimizer_like(lr_scheduler_class, LRSchedulerTypeTuple, nested_key, link_to, "optimizer",
                                 self._lr_schedulers)

    def _add_optimizer_like(self, classes: Any, base: Any, nested_key: str, link_to: str, skip: str,
                            register: dict[str, tuple[Any, str]]) -> None:
        given = classes if isinstance(classes, tuple) else (classes,)
        if not all(isinstance(c, type) and issubclass(c, base) for c in given):
            names = base.__name__ if isinstance(base, type) else " or ".join(b.__name__ for b in base)
            raise MisconfigurationException(f"{nested_key}: {classes!r} is not a {names} class (or a tuple of them)")
        options = {"instantiate": False, "fail_untyped": False, "skip": {skip}}
        if isinstance(classes, tuple):
            self.add_subclass_arguments(classes, nested_key, **options)
        else:
            self.add_class_arguments(classes, nested_key, **options)
        register[nested_key] = (classes, link_to)


def trainer_argument_advice(message: str) -> str:
    """For each ``trainer.NAME`` in ``message`` that the Trainer does not take, a line saying what to
    use (``unknown_argument_error``); "" when there is none."""
    import inspect

    from trainer.api.lightning_names import unknown_argument_error

    known = set(inspect.signature(_BaseTrainer.__init__).parameters)
    unknown = sorted({name for name in re.findall(r"trainer\.(\w+)", message) if name not in known})
    return f"\n  {unknown_argument_error(unknown, _BaseTrainer.__init__)}" if unknown else ""


def _plain(value: Any) -> bool:
    """Whether ``value`` is what a yaml config holds (None, a number, a string, a list / dict of them)."""
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(v) for v in value.values())
    return value is None or isinstance(value, (bool, int, float, str))


def instantiate_class(args: Any, init: dict[str, Any]) -> Any:
    """Build ``init["class_path"]`` (a dotted path; Lightning's read as the mirror's) with the
    positional ``args`` (one value or a tuple) and the keyword arguments ``init["init_args"]``."""
    import importlib

    positional = args if isinstance(args, tuple) else (args,)
    module_name, _, name = mirror_class_path(init["class_path"]).rpartition(".")
    cls = getattr(importlib.import_module(module_name), name)
    return cls(*positional, **dict(init.get("init_args", {})))
