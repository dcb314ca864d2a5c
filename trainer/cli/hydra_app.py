"""Hydra glue: build a Trainer and a TrainModule from the composed config, resolved once.

Without a launcher, ``train.py`` runs Hydra once; ``Trainer.fit`` then spawns the workers, which
receive the already built objects (Hydra never runs in them). Under torchrun / srun every rank
runs ``train.py``, so only rank 0 runs Hydra (one run directory, one ``.hydra/``, one
``${now:}``); it sends each job's resolved config to the other ranks, which wait in
``follow_rank_zero``. That also makes multirun (``-m``) work under a launcher.
"""

from __future__ import annotations

import logging
import sys
import warnings
from datetime import timedelta
from typing import Any, Callable

import torch

from trainer.trainer_checks import check_environment
from trainer.runtime import distributed
from trainer.runtime import elastic
from trainer.cli.errors import JobCannotStart, config_errors, exit_status, hydra_errors_in_one_line
from trainer.deepspeed_config.apply import apply_deepspeed_config
from trainer.runtime.launch import detect_environment, strip_local_rank_argument
from trainer.cli.hydra_errors import closest_first, did_you_mean, import_target
from trainer.cli.objective import check_objective, objective_value
from trainer.cli.optimizer_check import check_optimizer_settings
from trainer.cli.redact_files import redact_hydra_files

log = logging.getLogger(__name__)

# Trainer arguments that live outside the ``trainer`` config node.
_DATA_KEYS = ("batch_size", "global_batch_size", "num_workers", "pin_memory", "drop_last", "stream_mode")


def build(config: dict, run_dir: str) -> tuple[Any, Any]:
    """``(trainer, module)`` from a resolved config dict (the same on every rank)."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from trainer.runtime.value_checks import is_int
    from trainer.runtime.seeding import seed_everything
    from trainer.trainer import Trainer

    cfg = OmegaConf.create(config)
    check_config_keys(cfg)
    check_objective(config)
    if not is_int(cfg.trainer.seed):  # before seeding with it: the Trainer checks it too late for that
        raise ValueError(f"trainer.seed={cfg.trainer.seed!r} must be an integer")
    strategy = instantiate(cfg.strategy)
    trainer_args = OmegaConf.to_container(cfg.trainer)
    data_args = {k: cfg.data[k] for k in _DATA_KEYS if k in cfg.data}
    # The ``logger`` group composes to {name: options}, in the order selected; ``logger=[]`` leaves no node.
    loggers = OmegaConf.to_container(cfg.logger) if cfg.get("logger") is not None else []
    checkpoint = OmegaConf.to_container(cfg.checkpoint) if cfg.get("checkpoint") is not None else None
    precision = instantiate(cfg.precision) if cfg.get("precision") is not None else None
    precision = merge_precision(trainer_args.pop("precision", None), precision)  # trainer.precision=16-mixed
    if trainer_args.get("default_root_dir") is not None:
        raise ValueError(f"trainer.default_root_dir={trainer_args['default_root_dir']!r}: under train.py the run "
                         f"directory is Hydra's; set hydra.run.dir={trainer_args['default_root_dir']} instead")
    # The ``callbacks`` group composes to {name: {_target_: ...}} in the order selected; ``callbacks=[]`` leaves no node.
    callbacks = [instantiate(node) for node in cfg.callbacks.values()] if cfg.get("callbacks") is not None else []
    trainer = Trainer(
        strategy=strategy, run_dir=run_dir, config=config, loggers=loggers, checkpoint=checkpoint, precision=precision,
        callbacks=callbacks, **trainer_args, **data_args
    )
    # After the Trainer's own checks: building an optimizer imports torch's compiler stack (~2 s), which a
    # bad data.batch_size need not wait for. Torch's own checks of lr, betas, ...: here, not in every worker.
    check_optimizer_settings(config)
    # Layers built in a module's __init__ get the same initial weights in every run of this config.
    seed_everything(cfg.trainer.seed)
    module = instantiate(cfg.module)
    # The ``datamodule`` group (none by default): given to fit as datamodule= (run_job).
    trainer.datamodule = instantiate(cfg.datamodule) if cfg.get("datamodule") is not None else None
    return trainer, module


# The top-level nodes that conf/config.yaml and its groups define; the ``hydra`` node never reaches ``build``.
TOP_LEVEL_KEYS = ("trainer", "data", "module", "strategy", "optimizer", "scheduler", "precision", "logger",
                  "callbacks", "checkpoint", "datamodule", "deepspeed_config", "objective")
# Trainer arguments that ``build`` fills from other nodes: not settable under ``trainer``.
#: Lightning's Trainer arguments the Python API takes that train.py sets elsewhere: where.
_PYTHON_API_ONLY = {"logger": "the logger group (logger=[jsonl,csv]; logger=[] for none)",
                    "enable_checkpointing": "checkpoint=null, or the checkpoint.* settings"}
_TRAINER_ARGS_FROM_ELSEWHERE = ("strategy", "run_dir", "config", "loggers", "checkpoint", "callbacks", *_DATA_KEYS,
                                *_PYTHON_API_ONLY)
_HYDRA_KEYS = ("_target_", "_partial_", "_recursive_", "_convert_", "_args_")


def check_config_keys(cfg: Any) -> None:
    """Every key a user adds is read by something, or said not to be.

    An unknown top-level key: one warning naming it. An unknown key under ``trainer``, or under a
    node built from ``_target_`` (module, strategy, optimizer, scheduler, datamodule, callbacks.*) whose target
    takes no such argument: an error naming it and the known ones (before anything is built, so the
    optimizer's and scheduler's keys are refused now rather than at the first step). ``+data.<key>``
    that neither the trainer nor another override reads: an error (see ``_check_added_data_keys``).
    ``checkpoint``, ``logger`` and ``precision`` check their own keys.
    """
    import inspect

    from omegaconf import DictConfig

    from trainer.runtime.rank_logging import rank_zero_warn
    from trainer.trainer import Trainer

    # A recipe's own top-level node (recipe=hf_causal_lm's model.path) is read through interpolation.
    from omegaconf import OmegaConf

    unresolved = OmegaConf.to_yaml(cfg, resolve=False)
    unknown = [key for key in cfg if key not in TOP_LEVEL_KEYS and "${" + str(key) + "." not in unresolved]
    if unknown:
        rank_zero_warn(log, "config key(s) %s are read by nothing and ignored; the top-level keys are %s",
                       ", ".join(unknown), ", ".join(TOP_LEVEL_KEYS))
    from trainer.api.lightning_names import LIGHTNING_ARGUMENTS

    known = [name for name, p in inspect.signature(Trainer.__init__).parameters.items()
             if name != "self" and name not in _TRAINER_ARGS_FROM_ELSEWHERE and p.kind is not p.VAR_KEYWORD]
    extra = [key for key in cfg.trainer if key not in known]
    if extra:
        # A name with its own answer below (Lightning's, or data's) gets that answer, not a look-alike key.
        specific = extra[0] in _DATA_KEYS or extra[0] in LIGHTNING_ARGUMENTS or extra[0] in _PYTHON_API_ONLY
        guess = "" if specific else did_you_mean("trainer", extra[0], known)
        raise ValueError(f"trainer.{extra[0]} is not a trainer setting{guess}; "
                         f"the trainer settings are {', '.join(closest_first(extra[0], known))}"
                         + (f" (data.{extra[0]} is one)" if extra[0] in _DATA_KEYS else "")
                         + (f"; Lightning's {extra[0]} is {LIGHTNING_ARGUMENTS[extra[0]]}" if extra[0] in LIGHTNING_ARGUMENTS
                            else "")
                         + (f"; under train.py Lightning's {extra[0]} is {_PYTHON_API_ONLY[extra[0]]}"
                            if extra[0] in _PYTHON_API_ONLY else ""))
    nodes = [(name, cfg.get(name)) for name in ("module", "strategy", "optimizer", "scheduler", "datamodule")]
    if isinstance(cfg.get("callbacks"), DictConfig):
        nodes += [(f"callbacks.{name}", node) for name, node in cfg.callbacks.items()]
    for where, node in nodes:
        if not isinstance(node, DictConfig):
            continue
        if "_target_" not in node:
            raise ValueError(f"{where} has no _target_ (keys: {', '.join(map(str, node))})"
                             + (f"; select the callback with callbacks=[{where.split('.', 1)[1]}]"
                                if where.startswith("callbacks.") else ""))
        _check_target_arguments(where, node)
    _check_added_data_keys(cfg)


def merge_precision(name: Any, precision: Any) -> Any:
    """``trainer.precision`` (ours or Lightning's name) with the ``precision`` group's instance: the
    group's when they agree (it carries the loss-scaler options), the named one when the group is left
    at its default fp32, an error naming both when they differ."""
    if name is None:
        return precision
    from trainer.api.lightning_names import check_precision, precision_name
    from trainer.precision import Precision

    check_precision(name)
    wanted = precision_name(name)
    group = getattr(precision, "name", "fp32")
    if group == wanted:
        return precision
    if group != "fp32":
        raise ValueError(f"trainer.precision={name} ({wanted}) and precision={group} differ: give one")
    return Precision(wanted)


def _check_target_arguments(where: str, node: Any) -> None:
    """An error for a key of ``node`` that its ``_target_`` does not take (unless it takes ``**kwargs``)."""
    import inspect

    target = import_target(where, node._target_)  # a mistyped class name: the names its module does have
    try:
        parameters = inspect.signature(target).parameters
    except (TypeError, ValueError):  # a builtin without a signature: instantiate will say
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    names = [name for name, p in parameters.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    extra = [key for key in node if key not in names and key not in _HYDRA_KEYS]
    if extra:
        raise ValueError(f"{where}.{extra[0]}: {node._target_} takes no argument {extra[0]!r}"
                         f"{did_you_mean(where, extra[0], names)}; "
                         f"it takes {', '.join(closest_first(extra[0], names))}")


def _check_added_data_keys(cfg: Any) -> None:
    """``+data.<key>=...`` (a key no config declared) that nothing reads is an error: the data decide
    what is trained. The trainer reads ``_DATA_KEYS``; a recipe's module reads the data keys its yaml
    declares (``data.path`` in recipe=gpt) through interpolation, so those are left alone, and so is
    a key another override interpolates (``+module.x=${data.key}``). Needs Hydra's record of the
    overrides: nothing to check without it (a config built by hand, or a rank other than rank 0)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    from omegaconf import OmegaConf

    # As typed: resolving would replace "${data.key}" in another override by its value.
    overrides = [str(o) for o in OmegaConf.to_container(HydraConfig.get().overrides.task, resolve=False)]
    for override in overrides:
        # "+data.key=value" appends (Hydra refuses it for a declared key); "++" may override a declared one.
        if not override.startswith("+data.") or "=" not in override:
            continue
        key = override[len("+data."):].split("=", 1)[0].split(".", 1)[0]
        if key in _DATA_KEYS or any("${data." + key in other for other in overrides if other != override):
            continue
        declared = [k for k in cfg.data if k not in _DATA_KEYS and f"+data.{k}=" not in " ".join(overrides)]
        raise ValueError(
            f"data.{key} (+data.{key}=...) is read by nothing: the trainer reads data.{', data.'.join(_DATA_KEYS)}"
            + (f"; this recipe's module reads data.{', data.'.join(map(str, declared))}" if declared else "")
            + "; a recipe adds a data key by declaring it under data: in its yaml and passing ${data.<key>} to its module"
        )


class JobSkipped(Exception):
    """On a non-zero rank: some rank could not start the job; rank 0 reports it and goes on."""


def prepare(config: dict, run_dir: str) -> tuple[Any, Any]:
    """``build`` plus the check that the job fits the processes the launcher started, agreed by
    every rank before any of them starts training.

    Under a launcher a job that cannot start (a bad value, a strategy that does not match the
    process count, a file missing on one node) must fail on every rank together: a rank that
    failed alone would leave the others waiting for it in a collective, and in a multirun Hydra
    goes on with the next job on rank 0 while the others still wait in the failed one. Rank 0
    raises (its own error, or one naming the ranks that failed); the other ranks raise ``JobSkipped``.
    """
    error: BaseException | None = None
    built: tuple[Any, Any] | None = None
    try:
        built = build(config, run_dir)
        trainer = built[0]
        check_environment(detect_environment(), trainer.strategy, trainer.devices, trainer.num_nodes)
        built[0].strategy.check_module(built[1])  # (nd: the tensor-parallel degree and plan), in one line here
    except Exception as exc:  # reported below, after every rank said how it went
        error = exc
    outcomes = distributed.all_gather_object(None if error is None else f"{type(error).__name__}: {error}")
    failed = [(rank, message) for rank, message in enumerate(outcomes) if message is not None]
    if error is not None and distributed.rank() == 0:
        raise error
    if failed:
        if distributed.rank() == 0:
            raise JobCannotStart("the job cannot start: " + "; ".join(f"rank {r}: {m}" for r, m in failed))
        raise JobSkipped(failed)
    assert built is not None
    return built


def run_job(cfg: Any) -> dict[str, float] | float | None:
    """The Hydra task: resolve the config once, share it with the other ranks, fit. Returns the run's
    last metrics, or with ``objective.metric`` set that metric's last value (what a sweeper optimises);
    None for a multirun job that could not start (its error is printed)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    env = detect_environment()
    if env.external and env.distributed and not distributed.is_distributed():
        # A Hydra launcher plugin (submitit with several tasks per job) called this task on every rank.
        return as_ranks(env, lambda: (False, run_job(cfg)))[1]
    hydra_config = HydraConfig.get()
    multirun = hydra_config.mode == RunMode.MULTIRUN
    applied = False
    with config_errors(multirun):  # +deepspeed_config=ds.json: its settings under the typed overrides
        apply_deepspeed_config(cfg, hydra_config.overrides.task, hydra_config.runtime.cwd)
        applied = True
    if not applied:  # a multirun job whose JSON was refused (reported); the sweep goes on
        return None
    config = OmegaConf.to_container(cfg, resolve=True)
    run_dir = hydra_config.runtime.output_dir
    # Hydra wrote .hydra/*.yaml (and multirun.yaml) before calling us: take the secrets out.
    redact_hydra_files(config, run_dir, hydra_config.output_subdir, hydra_config.sweep.dir if multirun else None)
    if distributed.is_distributed():  # rank 0 under a launcher: the others wait for this
        elastic.record_run_dir(run_dir)
        distributed.broadcast_object(("job", config, run_dir))
    trainer = module = result = None
    with config_errors(multirun):  # one line, no traceback
        trainer, module = prepare(config, run_dir)
    if trainer is None:  # a multirun job that could not start (reported); the sweep goes on
        return None
    with config_errors(multirun, only_checkpoint=True):  # a damaged checkpoint: one line too
        result = trainer.fit(module, datamodule=trainer.datamodule)
    if result is None:
        return None
    with config_errors(multirun):
        return objective_value(config, result)
    return None  # a multirun job whose objective.metric was never logged (reported)


def follow_rank_zero() -> bool:
    """Non-zero ranks under a launcher: run each job rank 0 sends until it says stop. Returns
    whether rank 0 failed (e.g. a bad override, which it printed)."""
    while True:
        message = distributed.broadcast_object(None)
        if message[0] == "stop":
            return bool(message[1])
        _, config, run_dir = message
        try:
            trainer, module = prepare(config, run_dir)
        except JobSkipped:
            continue  # rank 0 reports why; in a multirun it goes on with the next job
        with config_errors(multirun=True, only_checkpoint=True):  # rank 0 reports it (the same error)
            trainer.fit(module, datamodule=trainer.datamodule)


def as_ranks(env: Any, rank_zero_work: Callable[[], tuple[bool, Any]]) -> tuple[bool, Any]:
    """Every rank a launcher started joins one process group; rank 0 runs ``rank_zero_work`` (which runs
    the jobs, sending each to the others, and returns whether one failed and a value), the others follow
    it until it says stop. Returns (whether some job failed, rank 0's value; None on the others)."""
    # Join early, with a generous timeout (the trainer sets the configured one), so rank 0 can
    # tell the others what to run. CPU tensors go over gloo, CUDA ones over NCCL.
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    distributed.init_process_group(env, backend, timedelta(minutes=30))
    # True once this rank and the others agreed to end (rank 0's "stop"): only then leave together
    # through a barrier. A rank that fails on its own must not wait there for peers that are
    # elsewhere; it exits, and the launcher stops the others.
    agreed, failed, returned = False, True, None
    try:
        if env.rank != 0:
            failed = follow_rank_zero()
            agreed = True
        else:
            try:
                failed, returned = rank_zero_work()
            finally:
                distributed.broadcast_object(("stop", failed))
                agreed = True
    finally:
        distributed.destroy_process_group(clean=agreed)
    return failed, returned


def register_plugins() -> None:
    """Register the trainer's Hydra plugins (``hydra/sweeper=optuna``, ``hydra/launcher=submitit_*``) by
    name: Hydra finds plugins by listing the ``hydra_plugins`` folders, which misses an editable install's."""
    from hydra.core.plugins import Plugins
    from hydra_plugins.meshtrainer_sweeper import OptunaSweeper, submitit_launchers

    # conf/hydra/launcher/submitit_*.yaml replace the plugin's configs of the same names (every key, our
    # launcher class); Hydra then also checks them against the plugin's schema, and says so in a warning.
    warnings.filterwarnings("ignore", message=r"(?s).*'hydra/launcher/submitit_(local|slurm)' is validated against "
                            r"ConfigStore schema with the same name")
    for plugin in (OptunaSweeper, getattr(submitit_launchers, "SubmititLocalLauncher", None),
                   getattr(submitit_launchers, "SubmititSlurmLauncher", None)):
        if plugin is not None:  # the launchers need the slurm extra
            Plugins.instance().register(plugin)


def main(hydra_task: Callable[[], Any]) -> None:
    """Entry point for ``train.py``: ``hydra_task`` is the ``@hydra.main`` function."""
    sys.argv = strip_local_rank_argument(sys.argv)
    register_plugins()
    env = detect_environment()
    if not (env.external and env.distributed):
        with hydra_errors_in_one_line():  # a mistyped key or option: one line, not Hydra's report
            hydra_task()
        if exit_status():  # a multirun job failed with a config error (printed)
            sys.exit(exit_status())
        return
    if env.rank == 0:
        sys.argv = elastic.pin_run_dir(sys.argv)  # a torchrun restart continues the first attempt's run

    def rank_zero_work() -> tuple[bool, None]:
        with hydra_errors_in_one_line():
            hydra_task()
        return bool(exit_status()), None

    try:
        failed, _ = as_ranks(env, rank_zero_work)
    except SystemExit as stop:  # Hydra ends rank 0 this way after printing an error
        code = stop.code
    else:
        code = 1 if failed else 0  # rank 0 failed: it printed why
    distributed.release_before_exit()  # the run's objects are gone: so is the group, and its threads
    sys.exit(code)
