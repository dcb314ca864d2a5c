"""``LightningCLI``: a Lightning program's command line, parsed by jsonargparse as Lightning's is.

``LightningCLI(Model, DataModule)`` builds a `LightningArgumentParser` with the groups ``trainer``
(this trainer's `trainer.lightning.Trainer` signature, Lightning's defaults), ``model``, ``data``,
``optimizer`` / ``lr_scheduler`` and ``seed_everything``; with ``run=True`` (the default) under the
subcommands ``fit`` / ``validate`` / ``test`` / ``predict``, each with its Trainer method's own arguments
(``--ckpt_path``). It parses ``args`` (default: ``sys.argv[1:]``; ``--config`` yaml files,
``--print_config``), seeds, builds the datamodule, the model (with a ``configure_optimizers`` made from
``--optimizer`` / ``--lr_scheduler`` when given) and the Trainer (its callbacks plus a
`SaveConfigCallback`), then runs the subcommand. Subclasses use Lightning's hooks:
``add_arguments_to_parser``, ``before_instantiate_classes``, ``after_instantiate_classes``,
``before_<subcommand>`` / ``after_<subcommand>``, ``configure_optimizers``, ``subcommands``.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from jsonargparse import ActionConfigFile, Namespace, class_from_function

from trainer.lightning.cli_optimizers import ConfiguredOptimizers, automatic_optimizer_keys, class_init, link_optimizers
from trainer.lightning.cli_parser import ArgsType, LightningArgumentParser, LRSchedulerTypeTuple, ReduceLROnPlateau
from trainer.lightning.cli_save_config import SaveConfigCallback
from trainer.lightning.core import LightningDataModule, LightningModule
from trainer.lightning.seed import seed_everything
from trainer.lightning.trainer.trainer import LIGHTNING_DEFAULTS, Trainer
from trainer.lightning.utilities.rank_zero import rank_zero_warn
from torch.optim import Optimizer


class LightningCLI:
    """Parse a Lightning program's command line and build (and with ``run=True`` run) its Trainer,
    model and datamodule; the arguments are Lightning's (the module docstring). After construction:
    ``config`` (parsed), ``config_init`` (built), ``model``, ``datamodule``, ``trainer``, ``subcommand``,
    ``parser``."""

    def __init__(self, model_class: Any = None, datamodule_class: Any = None,
                 save_config_callback: type[SaveConfigCallback] | None = SaveConfigCallback,
                 save_config_kwargs: dict[str, Any] | None = None, trainer_class: Any = Trainer,
                 trainer_defaults: dict[str, Any] | None = None, seed_everything_default: bool | int = True,
                 parser_kwargs: dict[str, Any] | None = None,
                 parser_class: type[LightningArgumentParser] = LightningArgumentParser,
                 subclass_mode_model: bool = False, subclass_mode_data: bool = False, args: ArgsType = None,
                 run: bool = True, auto_configure_optimizers: bool = True,
                 load_from_checkpoint_support: bool = True) -> None:
        self.save_config_callback = save_config_callback
        self.save_config_kwargs = save_config_kwargs or {}
        self.trainer_class = trainer_class
        self.trainer_defaults = trainer_defaults or {}
        self.seed_everything_default = seed_everything_default
        self.parser_kwargs = parser_kwargs or {}
        self.parser_class = parser_class
        self.auto_configure_optimizers = auto_configure_optimizers
        #: kept for Lightning's signature: hyperparameters are what the model's __init__ receives either way
        self.load_from_checkpoint_support = load_from_checkpoint_support
        self.model_class, self.datamodule_class = model_class, datamodule_class
        self._model_class = model_class or LightningModule  # (None: any LightningModule, by class_path)
        self.subclass_mode_model = model_class is None or subclass_mode_model
        self._datamodule_class = datamodule_class or LightningDataModule
        self.subclass_mode_data = datamodule_class is None or subclass_mode_data
        #: the Trainer arguments' defaults before ``trainer_defaults`` (an argument at it is left to the Trainer)
        self._trainer_baseline: dict[str, Any] = {}

        names = set(self.subcommands())
        main_kwargs = {k: v for k, v in self.parser_kwargs.items() if k not in names}
        self._subcommand_kwargs = {k: v for k, v in self.parser_kwargs.items() if k in names}
        self.setup_parser(run, main_kwargs, self._subcommand_kwargs)
        self.parse_arguments(self.parser, args)
        self.subcommand = self.config["subcommand"] if run else None
        self._set_seed()
        self.before_instantiate_classes()
        self.instantiate_classes()
        self.after_instantiate_classes()
        if self.subcommand is not None:
            self._run_subcommand(self.subcommand)

    # ------------------------------------------------------------------ the parser
    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """A new parser (``parser_class(**kwargs)``) with ``-c`` / ``--config``."""
        kwargs.setdefault("dump_header", ["trainer.lightning (meshtrainer)"])
        parser = self.parser_class(**kwargs)
        parser.add_argument("-c", "--config", action=ActionConfigFile,
                            help="Path to a configuration file in json or yaml format.")
        return parser

    def setup_parser(self, add_subcommands: bool, main_kwargs: dict[str, Any],
                     subparser_kwargs: dict[str, Any]) -> None:
        """Build ``self.parser``: the subcommands (``add_subcommands``) or the arguments directly."""
        self.parser = self.init_parser(**main_kwargs)
        self._subcommand_parsers: dict[str, LightningArgumentParser] = {}
        self._subcommand_method_arguments: dict[str, list[str]] = {}
        if not add_subcommands:
            self._add_arguments(self.parser)
            return
        subcommands = self.parser.add_subcommands()
        trainer_class = self._trainer_type()
        for name, skip in self.subcommands().items():
            method = getattr(_signature_owner(trainer_class, name), name)
            description = (inspect.getdoc(method) or "").split("\n", 1)[0] or None
            kwargs = dict(subparser_kwargs.get(name, {}))
            kwargs.setdefault("description", description)
            parser = self.init_parser(**kwargs)
            self._add_arguments(parser)
            self._subcommand_method_arguments[name] = parser.add_method_arguments(
                _signature_owner(trainer_class, name), name, skip=set(skip) | {"module"})
            self._subcommand_parsers[name] = parser
            subcommands.add_subcommand(name, parser, help=description)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """The subcommands and the arguments of their Trainer method not on the command line."""
        return {
            "fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
            "validate": {"model", "dataloaders", "datamodule"},
            "test": {"model", "dataloaders", "datamodule"},
            "predict": {"model", "dataloaders", "datamodule"},
        }

    def add_default_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """``--seed_everything``: an int seeds with it, True with ``PL_GLOBAL_SEED`` (else 0), False not at all."""
        parser.add_argument("--seed_everything", type=bool | int, default=self.seed_everything_default,
                            help="An int: seed_everything(int) before the classes are built; True: "
                                 "seed_everything() (PL_GLOBAL_SEED, else 0); False: no seeding.")

    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """The ``trainer``, ``model`` and ``data`` groups."""
        parser.add_lightning_class_args(self.trainer_class, "trainer")
        lightning = {f"trainer.{k}": v for k, v in LIGHTNING_DEFAULTS.items()}
        if "trainer.seed" in parser.get_defaults():
            lightning["trainer.seed"] = None  # (None: the seed seed_everything set, as the Trainer reads it)
        parser.set_defaults(lightning)
        self._trainer_baseline = dict(vars(parser.get_defaults().get("trainer") or Namespace()))
        parser.set_defaults({f"trainer.{k}": v for k, v in self.trainer_defaults.items() if k != "callbacks"})
        parser.add_lightning_class_args(self._model_class, "model", subclass_mode=self.subclass_mode_model)
        parser.add_lightning_class_args(self._datamodule_class, "data", subclass_mode=self.subclass_mode_data,
                                        required=self.datamodule_class is not None)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Override to add arguments or links (``parser.link_arguments``)."""

    def _add_arguments(self, parser: LightningArgumentParser) -> None:
        self.add_default_arguments_to_parser(parser)
        self.add_core_arguments_to_parser(parser)
        self.add_arguments_to_parser(parser)
        if self.auto_configure_optimizers:
            if not parser._optimizers:
                parser.add_optimizer_args((Optimizer,))
            if not parser._lr_schedulers:
                parser.add_lr_scheduler_args(LRSchedulerTypeTuple)
        self.link_optimizers_and_lr_schedulers(parser)

    @staticmethod
    def link_optimizers_and_lr_schedulers(parser: LightningArgumentParser) -> None:
        """Link each optimizer / scheduler group with a ``link_to`` key to that key."""
        link_optimizers(parser)

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """Parse ``args`` (a list of command-line tokens, a dict / Namespace of values, or None for
        ``sys.argv[1:]``) into ``self.config``."""
        if args is not None and len(sys.argv) > 1:
            rank_zero_warn(f"LightningCLI(args={args!r}) parses args and not the command line sys.argv[1:]="
                           f"{sys.argv[1:]!r}; give one of them")
        if isinstance(args, (dict, Namespace)):
            self.config = parser.parse_object(args)
        else:
            self.config = parser.parse_args(args)

    def _parser(self, subcommand: str | None) -> LightningArgumentParser:
        return self.parser if subcommand is None else self._subcommand_parsers[subcommand]

    def _get(self, config: Namespace, key: str, default: Any = None) -> Any:
        return config.get(str(self.subcommand), config).get(key, default)

    def _trainer_type(self) -> type:
        return self.trainer_class if isinstance(self.trainer_class, type) else class_from_function(self.trainer_class)

    # ------------------------------------------------------------------ building
    def _set_seed(self) -> None:
        seed = self._get(self.config, "seed_everything")
        if seed is False:
            return
        seed = seed_everything(None if seed is True else seed, workers=True)
        self.config.get(str(self.subcommand), self.config)["seed_everything"] = seed

    def before_instantiate_classes(self) -> None:
        """Override to run code before the classes are built."""

    def instantiate_classes(self) -> None:
        """Build the datamodule, the model (and its ``configure_optimizers``) and the Trainer."""
        build = getattr(self.parser, "instantiate", None) or self.parser.instantiate_classes  # (jsonargparse < 4.49)
        self.config_init = build(self.config)
        self.datamodule = self._get(self.config_init, "data")
        self.model = self._get(self.config_init, "model")
        self._add_configure_optimizers_method_to_model(self.subcommand)
        self.trainer = self.instantiate_trainer()

    def after_instantiate_classes(self) -> None:
        """Override to run code after the classes are built."""

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The Trainer from the ``trainer`` group (and ``kwargs``): the arguments at their default are
        left to the Trainer; the callbacks are the configured ones, those of `add_lightning_class_args`,
        ``trainer_defaults["callbacks"]`` and the `SaveConfigCallback`."""
        config = {k: v for k, v in dict(self._get(self.config_init, "trainer", default={})).items()
                  if k not in self._trainer_baseline or not _same(v, self._trainer_baseline[k])}
        config.update(kwargs)
        callbacks = config.get("callbacks")
        callbacks = [] if callbacks is None else list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
        callbacks += [self._get(self.config_init, key) for key in self._parser(self.subcommand).callback_keys]
        extra = self.trainer_defaults.get("callbacks", [])
        callbacks += list(extra) if isinstance(extra, (list, tuple)) else [extra]
        if self.save_config_callback is not None and not config.get("fast_dev_run", False):
            callbacks.append(self.save_config_callback(self._parser(self.subcommand),
                                                       self.config.get(str(self.subcommand), self.config),
                                                       **self.save_config_kwargs))
        if callbacks:
            config["callbacks"] = callbacks
        return self.trainer_class(**config)

    @staticmethod
    def configure_optimizers(lightning_module: LightningModule, optimizer: Optimizer,
                             lr_scheduler: Any = None) -> Any:
        """What the model's ``configure_optimizers`` returns when ``--optimizer`` is given: the optimizer,
        with the scheduler stepping once per epoch as under Lightning (a `ReduceLROnPlateau` with its
        ``monitor``). Override to change it."""
        if lr_scheduler is None:
            return optimizer
        if isinstance(lr_scheduler, ReduceLROnPlateau):
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": lr_scheduler, "monitor": lr_scheduler.monitor}}
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": lr_scheduler, "interval": "epoch"}}

    def _add_configure_optimizers_method_to_model(self, subcommand: str | None) -> None:
        """With ``--optimizer`` given (an AUTOMATIC group), the model's ``configure_optimizers`` builds
        that optimizer (and ``--lr_scheduler``) and returns `configure_optimizers`' answer."""
        if not self.auto_configure_optimizers:
            return
        keys = automatic_optimizer_keys(self._parser(subcommand), type(self).__name__)
        if keys is None:
            return
        optimizer_init = self._get(self.config_init, keys[0])
        if not optimizer_init:
            return
        scheduler_init = self._get(self.config_init, keys[1]) if keys[1] else None
        if "configure_optimizers" in vars(type(self.model)) or any(
                "configure_optimizers" in vars(c) for c in type(self.model).__mro__[1:]
                if issubclass(c, LightningModule) and c is not LightningModule):
            rank_zero_warn(f"`{type(self.model).__name__}.configure_optimizers` will be overridden by "
                           f"`{type(self).__name__}.configure_optimizers` (--optimizer was given)")
        parser = self._parser(subcommand)
        self.model.configure_optimizers = ConfiguredOptimizers(
            self.model, type(self).configure_optimizers, class_init(parser._optimizers[keys[0]][0], optimizer_init),
            class_init(parser._lr_schedulers[keys[1]][0], scheduler_init) if scheduler_init else None)

    # ------------------------------------------------------------------ running
    def _run_subcommand(self, subcommand: str) -> None:
        before, after = getattr(self, f"before_{subcommand}", None), getattr(self, f"after_{subcommand}", None)
        if callable(before):
            before()
        run = getattr(self, subcommand, getattr(self.trainer, subcommand))
        allowed = self._subcommand_method_arguments[subcommand]
        kwargs = {k: v for k, v in self.config_init[subcommand].items() if k in allowed}
        kwargs["model"] = self.model
        if self.datamodule is not None:
            kwargs["datamodule"] = self.datamodule
        run(**kwargs)
        if callable(after):
            after()


def _signature_owner(trainer_class: type, method: str) -> type:
    """The first class of ``trainer_class``'s MRO whose ``method`` names its parameters (no ``*args``):
    the mirror's ``Trainer.fit(*args, **kwargs)`` hands them to `trainer.Trainer.fit`'s."""
    for cls in trainer_class.__mro__:
        function = vars(cls).get(method)
        if function is not None and not any(p.kind is p.VAR_POSITIONAL
                                            for p in inspect.signature(function).parameters.values()):
            return cls
    return trainer_class


def _same(value: Any, default: Any) -> bool:
    """Whether a parsed Trainer argument is its parser default (a tuple default parses as a list)."""
    value, default = _lists(value), _lists(default)
    try:
        return type(value) is type(default) and bool(value == default)
    except Exception:  # (a value whose == is not a bool: a tensor)
        return False


def _lists(value: Any) -> Any:
    return [_lists(v) for v in value] if isinstance(value, (list, tuple)) else value
