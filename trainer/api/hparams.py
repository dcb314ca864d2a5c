"""``save_hyperparameters``: an object's init arguments, by name, as ``self.hparams`` (on
``TrainModule`` and ``DataModule``, through `HyperparametersMixin`).

Captured like Lightning's: from the frame of the user's ``__init__`` (through a chain of
``super().__init__`` calls, the most derived class's values win). Every value is kept as it is:
numbers and strings, and objects too (an ``nn.Module``, a ``functools.partial`` optimizer factory, a
class, an object Hydra built). What happens to them afterwards:

- loggers and ``hparams.yaml`` show them as text a human reads (``hparams_display.py``), secrets
  redacted (``trainer/runtime/redact.py``);
- a checkpoint keeps plain values in its ``trainer_state.json`` and the objects pickled in its
  ``hparams.pt`` (``hparams_archive.py``), which only ``load_from_checkpoint`` unpickles: resuming a
  run never does.
"""

from __future__ import annotations

import copy
import inspect
import logging
from argparse import Namespace
from types import FrameType
from typing import Any, Iterable, Mapping

from trainer.runtime.rank_logging import rank_zero_warn

log = logging.getLogger(__name__)

#: How far up the stack ``save_hyperparameters`` looks for the ``__init__`` it was called from.
_MAX_FRAMES = 32


class AttributeDict(dict):
    """A dict whose items are also attributes: ``hparams.lr`` is ``hparams["lr"]``."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"no hyperparameter {key!r}; saved: {sorted(self)}") from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def __delattr__(self, key: str) -> None:
        del self[key]

    def __eq__(self, other: object) -> bool:
        """As a dict's; equal also to another mapping with the same items (the OmegaConf ``DictConfig``
        a module's hyperparameters were saved from, which a dict subclass does not compare to)."""
        if isinstance(other, Mapping) and not isinstance(other, dict):
            return dict(self) == dict(other.items())
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # type: ignore[assignment]  (mutable, as a dict)


def is_json_exact(value: Any) -> bool:
    """Whether ``value`` comes back from JSON as it went in (same types: no tuples, no objects)."""
    if value is None or type(value) in (bool, int, float, str):
        return True
    if type(value) is list:
        return all(is_json_exact(v) for v in value)
    if type(value) in (dict, AttributeDict):
        return all(type(k) is str and is_json_exact(v) for k, v in value.items())
    return False


def _init_frame(obj: Any, frame: FrameType | None) -> FrameType | None:
    """The innermost ``__init__`` frame of ``obj`` at or above ``frame`` (a helper called from
    ``__init__`` may call ``save_hyperparameters``), or None."""
    for _ in range(_MAX_FRAMES):
        if frame is None:
            return None
        if frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is obj:
            return frame
        frame = frame.f_back
    return None


def init_arguments(obj: Any, frame: FrameType) -> dict[str, Any]:
    """The arguments of the ``__init__`` calls on the stack that build ``obj``, starting at
    ``frame``: every named parameter and the contents of ``**kwargs`` (``*args`` has no names: skipped)."""
    found: list[dict[str, Any]] = []
    while frame is not None and frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is obj:
        code, local = frame.f_code, frame.f_locals
        count = code.co_argcount + code.co_kwonlyargcount
        names = list(code.co_varnames[:count])
        values = {name: local[name] for name in names[1:] if name in local}  # names[0] is self
        flags = code.co_flags
        position = count
        if flags & inspect.CO_VARARGS:
            position += 1
        if flags & inspect.CO_VARKEYWORDS:
            extra = local.get(code.co_varnames[position], {})
            values.update(extra if isinstance(extra, Mapping) else {})
        found.append(values)
        frame = frame.f_back
    merged: dict[str, Any] = {}
    for values in found:  # innermost (base class) first: the derived classes' values win
        merged.update(values)
    return merged


def collect(obj: Any, args: tuple, ignore: str | Iterable[str] | None, frame: FrameType | None,
            saved: Mapping[str, Any] = ()) -> tuple[dict[str, Any], list[str], str | None]:
    """What ``save_hyperparameters(*args, ignore=...)`` keeps: (the values, the ignored names, the
    init argument the values came in as one mapping, or None). ``saved``: what an earlier call kept."""
    name = None
    if len(args) == 1 and isinstance(args[0], (Mapping, Namespace)):
        given = args[0]
        chosen = dict(vars(given) if isinstance(given, Namespace) else given)
        init = _init_frame(obj, frame)
        available = init_arguments(obj, init) if init is not None else {}
        # The init argument the mapping came in as: load_from_checkpoint passes it back under that name.
        name = next((key for key, value in available.items() if value is given), None)
    else:
        init = _init_frame(obj, frame)
        if init is None:
            raise RuntimeError(
                f"save_hyperparameters() must be called from {type(obj).__name__}.__init__ (it reads that call's "
                "arguments; frame= names another frame), or be given a dict of hyperparameters"
            )
        available = init_arguments(obj, init)
        for key in args:
            if not isinstance(key, str):
                raise TypeError(f"save_hyperparameters: give argument names (str) or one dict, got {key!r}")
        unknown = [key for key in args if key not in available]
        if unknown:
            raise ValueError(f"save_hyperparameters: {unknown} are not arguments of {type(obj).__name__}.__init__; "
                             f"its arguments are {sorted(available)}")
        chosen = {key: available[key] for key in args} if args else available
    ignored = [ignore] if isinstance(ignore, str) else list(ignore or ())
    unknown = [key for key in ignored if key not in chosen and key not in saved]
    if unknown:  # nothing to leave out (Lightning accepts it): said, in case of a misspelt name
        rank_zero_warn(log, "save_hyperparameters(ignore=%s): %s are not among the hyperparameters %s; nothing "
                       "left out for them", ignored, unknown, sorted({*chosen, *saved}))
    return {key: value for key, value in chosen.items() if key not in ignored}, ignored, name


class HyperparametersMixin:
    """``save_hyperparameters()`` and ``self.hparams`` (Lightning's ``HyperparametersMixin``)."""

    def save_hyperparameters(self, *args: Any, ignore: str | Iterable[str] | None = None,
                             frame: FrameType | None = None, logger: bool = True) -> None:
        """Keep the ``__init__`` arguments as ``self.hparams`` (call it in ``__init__``): all of them,
        the names given (``save_hyperparameters("lr", "width")``) or one dict / ``Namespace``, minus
        ``ignore`` (a name or a list; it also drops a key an earlier call saved). A second call adds
        to what the first kept. Values are kept as they are, objects included (an ``nn.Module``, a
        ``functools.partial`` optimizer, a class); assign more later with ``self.hparams.name = value``.

        ``frame``: the frame to read the init arguments from (default: the caller's); ``logger``:
        False keeps them from the loggers (they still go into checkpoints).

        Checkpoints keep them (objects pickled beside the weights; a value that cannot be pickled is
        named in a warning when training starts), so that ``load_from_checkpoint(path)`` rebuilds
        the object without arguments; loggers and ``hparams.yaml`` show them as readable text.
        Secrets (``api_key``, passwords, tokens ...) are redacted everywhere and never stored:
        ``load_from_checkpoint`` asks for them again."""
        if frame is None:
            current = inspect.currentframe()
            frame = current.f_back if current is not None else None
            del current  # a frame referenced from a local is a reference cycle
        try:
            kept, ignored, name = collect(self, args, ignore, frame, self.hparams)
        finally:
            del frame
        hparams = self.hparams
        hparams.update(kept)
        for key in ignored:
            hparams.pop(key, None)
        self.__dict__["_hparams_name"] = name if len(hparams) == len(kept) else None
        self.__dict__["_log_hyperparams"] = bool(logger)
        # What the loggers show: the values as saved now (plain ones copied; objects by reference,
        # a deep copy of a model would double its memory).
        self.__dict__["_hparams_initial"] = AttributeDict(
            {key: copy.deepcopy(value) if is_json_exact(value) else value for key, value in hparams.items()})

    @property
    def hparams(self) -> AttributeDict:
        """The saved hyperparameters (an ``AttributeDict``: ``self.hparams.lr`` or ``self.hparams["lr"]``),
        mutable: ``self.hparams.extra = value`` adds one (checkpoints keep it too)."""
        return self.__dict__.setdefault("_hparams", AttributeDict())

    @property
    def hparams_initial(self) -> AttributeDict:
        """The hyperparameters as ``save_hyperparameters`` saved them (what the loggers show)."""
        return AttributeDict(self.__dict__.get("_hparams_initial") or {})


def logged_hparams(obj: Any) -> dict[str, Any]:
    """What ``obj`` (a module or datamodule) sends to the loggers: its initial hyperparameters, unless
    ``save_hyperparameters(logger=False)`` or none were saved."""
    if obj is None or not getattr(obj, "__dict__", {}).get("_log_hyperparams", False):
        return {}
    return dict(obj.hparams_initial)


def merged_for_loggers(module: Any, datamodule: Any) -> dict[str, Any]:
    """The module's and the datamodule's logged hyperparameters in one dict; a key in both with
    different values is an error (as in Lightning)."""
    from_module, from_data = logged_hparams(module), logged_hparams(datamodule)
    clashing = sorted(key for key in from_module.keys() & from_data.keys()
                      if type(from_module[key]) is not type(from_data[key]) or not _same(from_module[key], from_data[key]))
    if clashing:
        raise RuntimeError(f"hyperparameters {clashing} are saved by both {type(module).__name__} and "
                           f"{type(datamodule).__name__} with different values; the loggers get one set: rename one "
                           "or pass ignore=[...] to one save_hyperparameters")
    return {**from_module, **from_data}


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # a tensor's == is not one bool
        return False


def for_loggers(config: Mapping[str, Any] | None, hparams: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the loggers' ``log_hyperparams`` gets: the run's config (Hydra) with the hyperparameters
    under ``"hparams"``, or the hyperparameters alone (a run from Python); None: nothing. Objects
    are shown as readable text (``hparams_display.readable``)."""
    from trainer.api.hparams_display import readable

    shown = {key: readable(value) for key, value in hparams.items()}
    if config is None:
        return shown or None
    if not shown:
        return dict(config)
    return {**config, "hparams": shown}
