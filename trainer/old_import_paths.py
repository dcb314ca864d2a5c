"""Module paths of the flat layout, kept importable for one release.

``import trainer.module`` (or a Hydra ``_target_: trainer.schedules.warmup_cosine``) still works: the
old name is the new module itself (the same object, so attributes read, set or monkeypatched through
either name are one), and the first import of each old name warns once, naming the new path.

The recipes' old top-level name ``recipes`` (``_target_: recipes.mlp.MLPClassifier``) answers with
``trainer.recipes`` the same way, with one warning for the whole package, unless another package
named ``recipes`` is importable: that one is the user's, and it wins.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType

#: old path -> the module it moved to
MOVED: dict[str, str] = {
    "trainer.batch_size_finder": "trainer.loop.batch_size_finder",
    "trainer.batch_size_trial": "trainer.loop.batch_size_trial",
    "trainer.callbacks.base": "trainer.api.callback",
    "trainer.checkpoint.resume": "trainer.loop.resume",
    "trainer.cli_errors": "trainer.cli.errors",
    "trainer.comms_log": "trainer.runtime.comms_log",
    "trainer.datamodule": "trainer.api.datamodule",
    "trainer.distributed": "trainer.runtime.distributed",
    "trainer.elastic": "trainer.runtime.elastic",
    "trainer.evaluation": "trainer.loop.evaluation",
    "trainer.hparams": "trainer.api.hparams",
    "trainer.launch": "trainer.runtime.launch",
    "trainer.lightning_hooks": "trainer.api.lightning_hooks",
    "trainer.lightning_names": "trainer.api.lightning_names",
    "trainer.load_checkpoint": "trainer.checkpoint.load_module",
    "trainer.loaders": "trainer.data.loaders",
    "trainer.loggers.redact": "trainer.runtime.redact",
    "trainer.loss_normalization": "trainer.loop.loss_normalization",
    "trainer.lr_scheduling": "trainer.optim.lr_scheduling",
    "trainer.manual_optimization": "trainer.loop.manual_step",
    "trainer.memory": "trainer.runtime.memory",
    "trainer.metrics": "trainer.runtime.metric_sums",
    "trainer.model_summary": "trainer.observe.model_summary",
    "trainer.module": "trainer.api.module",
    "trainer.module_hooks": "trainer.api.hook_calls",
    "trainer.module_log_api": "trainer.api.log_methods",
    "trainer.module_logging": "trainer.loop.log_collector",
    "trainer.optimizers": "trainer.optim.optimizers",
    "trainer.param_groups": "trainer.optim.param_groups",
    "trainer.peak_memory": "trainer.runtime.peak_memory",
    "trainer.permutation": "trainer.data.permutation",
    "trainer.profiling": "trainer.observe.profiling",
    "trainer.progress": "trainer.observe.progress",
    "trainer.rank_logging": "trainer.runtime.rank_logging",
    "trainer.redact_files": "trainer.cli.redact_files",
    "trainer.run_limits": "trainer.loop.run_limits",
    "trainer.run_state": "trainer.api.run_state",
    "trainer.sanity_check": "trainer.loop.sanity_check",
    "trainer.schedules": "trainer.optim.schedules",
    "trainer.seeding": "trainer.runtime.seeding",
    "trainer.speedups": "trainer.strategies.speedups",
    "trainer.step_accounting": "trainer.loop.step_accounting",
    "trainer.step_limits": "trainer.loop.step_limits",
    "trainer.strategies.pipeline_step": "trainer.loop.pipeline_micro_batches",
    "trainer.streaming": "trainer.data.streaming",
    "trainer.streaming.checkpoint": "trainer.checkpoint.stream_position",
    "trainer.streaming.limits": "trainer.loop.stream_limits",
    "trainer.streaming.loader": "trainer.data.streaming.loader",
    "trainer.streaming.plan": "trainer.data.streaming.plan",
    "trainer.streaming.protocol": "trainer.data.streaming.protocol",
    "trainer.streaming.reader": "trainer.data.streaming.reader",
    "trainer.streaming.validation": "trainer.data.streaming.validation",
    "trainer.sync_batchnorm": "trainer.strategies.sync_batchnorm",
    "trainer.tensors": "trainer.runtime.tensors",
    "trainer.throughput": "trainer.observe.throughput",
    "trainer.token_weights": "trainer.loop.token_weights",
    "trainer.train_step": "trainer.loop.train_step",
    "trainer.trainer_arguments": "trainer.api.trainer_arguments",
    "trainer.user_loader": "trainer.data.user_loader",
    "trainer.validation": "trainer.loop.validation",
    "trainer.validation_shard": "trainer.data.validation_shard",
    "trainer.weight_init": "trainer.strategies.weight_init",
    "trainer.weights_return": "trainer.loop.weights_return",
    "trainer.wrap_policy": "trainer.strategies.wrap_policy",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers imports of an old path with the module at its new path."""

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        if fullname in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec) -> ModuleType:
        new = MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; the old path stops working in the next release",
                      FutureWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the new module ran already


OLD_RECIPES = "recipes"
NEW_RECIPES = "trainer.recipes"


def _recipes_are_ours() -> bool:
    """Whether ``import recipes`` would find no package, or this package's own recipes (a checkout,
    where the top-level ``recipes/`` is on ``sys.path``) rather than another project's."""
    import os
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec(OLD_RECIPES)
    if spec is None or not spec.submodule_search_locations:
        return spec is None
    ours = os.path.realpath(os.path.join(os.path.dirname(__file__), "recipes"))
    return any(os.path.realpath(location) == ours for location in spec.submodule_search_locations)


class _OldRecipes(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers ``recipes`` and ``recipes.<module>`` with ``trainer.recipes`` and its modules."""

    warned = False

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        if fullname != OLD_RECIPES and not fullname.startswith(OLD_RECIPES + "."):
            return None
        if not _recipes_are_ours():
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=fullname == OLD_RECIPES)

    def create_module(self, spec) -> ModuleType:
        new = NEW_RECIPES + spec.name[len(OLD_RECIPES):]
        if not _OldRecipes.warned:
            _OldRecipes.warned = True
            warnings.warn(f"the recipes moved from {OLD_RECIPES}.* to {NEW_RECIPES}.* ({spec.name} is {new}); "
                          f"the old name stops working in the next release", FutureWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        pass  # the new module ran already


def install() -> None:
    """Put the finders first, so an old path never loads a second copy of a moved file."""
    for finder in (_MovedModules, _OldRecipes):
        if not any(isinstance(existing, finder) for existing in sys.meta_path):
            sys.meta_path.insert(0, finder())
