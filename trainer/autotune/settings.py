"""The autotuner's input: the user's overrides, composed with Hydra into the config being tuned, and
the ``autotune:`` block (conf/autotune.yaml) checked.

Every override except ``autotune.*`` describes the run being tuned, exactly as ``train.py`` takes
it: it is passed to every trial and written into the best config. The autotuner chooses the
strategy itself, so ``strategy=`` / ``strategy.*`` overrides are refused (name the strategies in
``autotune.strategies``); ``hydra.*`` ones are refused too (each trial's run directory is the
autotuner's), and so are sweeps and ``~key`` deletions, which a single config file cannot express.
"""

from __future__ import annotations

import datetime
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.cli.hydra_errors import describe
from trainer.runtime.config_dir import builtin_config_dir
from trainer.runtime.value_checks import is_int

CONF_DIR = builtin_config_dir()
#: What a trial runs: the ``trainer`` command (``python -m trainer``), with train.py's overrides.
TRAIN_COMMAND = [sys.executable, "-m", "trainer"]
PRIMARY = "autotune"  # conf/autotune.yaml: conf/config.yaml plus the autotune: block


class AutotuneError(ValueError):
    """A setting the autotuner cannot honour; the message names the value and what is allowed."""


@dataclass(frozen=True)
class Settings:
    """The checked ``autotune:`` block (see conf/autotune.yaml for each key's meaning)."""

    budget_s: float
    steps: int
    warmup_steps: int
    micro_batch_sizes: list[int] | None
    strategies: list[str]
    activation_checkpointing: list[bool] | None
    out_dir: Path
    tp_degrees: list[int] | None = None  # None: every degree the module accepts, when it declares a TP plan


@dataclass
class Job:
    """What is tuned: the user's overrides for ``train.py`` (``autotune.*`` taken out, in the order
    typed), the config they compose to (``autotune`` block included) and the checked settings."""

    overrides: list[str]
    config: Any  # omegaconf.DictConfig
    settings: Settings

    def typed(self, key: str) -> bool:
        """Whether the user gave ``key`` on the command line."""
        return any(_key(override) == key for override in self.overrides)


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(run overrides, autotune overrides)``, refusing what a trial or a config file cannot take."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for arg in argv:
        if arg.startswith("-") and not arg.startswith("~"):
            raise AutotuneError(f"{arg!r}: the autotuner takes key=value overrides only (as train.py does, "
                                f"without Hydra's flags); it writes its own config file")
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(argv))
    except HydraException as error:  # Hydra's message names the override it cannot read
        raise AutotuneError(" ".join(str(error).split())) from error
    run, tune = [], []
    for override, arg in zip(parsed, argv):
        key = override.key_or_group
        if override.is_sweep_override():
            raise AutotuneError(f"{arg!r} is a sweep: give one value (the autotuner makes its own candidates)")
        if override.is_delete():
            raise AutotuneError(f"{arg!r}: deleting a key is not supported by the autotuner; set it to a value")
        if override.package is not None:
            raise AutotuneError(f"{arg!r}: a group with a package (@) is not supported by the autotuner")
        if key == "strategy" or key.startswith("strategy."):
            raise AutotuneError(f"{arg!r}: the autotuner chooses the strategy; name the candidates in "
                                f"autotune.strategies (e.g. 'autotune.strategies=[ddp,fsdp_full]')")
        if key == "hydra" or key.startswith("hydra."):
            raise AutotuneError(f"{arg!r}: the autotuner places each trial's run directory under autotune.out_dir; "
                                f"set hydra.* when running the best config")
        (tune if key == "autotune" or key.startswith("autotune.") else run).append(arg)
    return run, tune


def compose(overrides: list[str]) -> Any:
    """The config conf/autotune.yaml composes to with ``overrides`` (no ``hydra`` node)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        try:
            return hydra_compose(PRIMARY, overrides=overrides)
        except Exception as error:  # a mistyped key or option: train.py's one line (the groups are known here)
            message = describe(error)
            if message is None:
                raise
            raise AutotuneError(message) from None


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise AutotuneError(message)


def check_settings(block: dict[str, Any], now: datetime.datetime | None = None) -> Settings:
    """``Settings`` from the composed ``autotune`` node (a plain dict), or an ``AutotuneError``."""
    from trainer.autotune.candidates import STRATEGIES, TENSOR_PARALLEL

    known = [*STRATEGIES, TENSOR_PARALLEL]

    budget = block["budget_s"]
    _require(isinstance(budget, (int, float)) and not isinstance(budget, bool) and budget > 0,
             f"autotune.budget_s must be a number of seconds > 0, got {budget!r}")
    for name in ("steps", "warmup_steps"):
        _require(is_int(block[name]) and block[name] >= 1, f"autotune.{name} must be an integer >= 1, got {block[name]!r}")
    micro = block["micro_batch_sizes"]
    _require(micro is None or (isinstance(micro, list) and micro and all(is_int(m) and m >= 1 for m in micro)),
             f"autotune.micro_batch_sizes must be null or a non-empty list of integers >= 1, got {micro!r}")
    strategies = block["strategies"]
    _require(isinstance(strategies, list) and strategies,
             f"autotune.strategies must be a non-empty list of {', '.join(known)}, got {strategies!r}")
    for name in strategies:
        _require(name in known, f"autotune.strategies: unknown strategy {name!r}; known: {', '.join(known)}")
    _require(len(set(strategies)) == len(strategies), f"autotune.strategies lists one twice: {strategies}")
    ckpt = block["activation_checkpointing"]
    _require(ckpt is None or (isinstance(ckpt, list) and ckpt and all(isinstance(c, bool) for c in ckpt)),
             f"autotune.activation_checkpointing must be null or a non-empty list of true / false, got {ckpt!r}")
    tp = block.get("tp_degrees")
    _require(tp is None or (isinstance(tp, list) and all(is_int(t) and t >= 2 for t in tp)),
             f"autotune.tp_degrees must be null or a list of integers >= 2 (tensor-parallel ranks), got {tp!r}")
    _require(not tp or TENSOR_PARALLEL in strategies,
             f"autotune.tp_degrees={tp}: the tensor-parallel candidates need {TENSOR_PARALLEL} in autotune.strategies, "
             f"got {strategies}")
    out_dir = block["out_dir"]
    _require(out_dir is None or isinstance(out_dir, str), f"autotune.out_dir must be a path or null, got {out_dir!r}")
    if out_dir is None:
        out_dir = os.path.join("outputs", "autotune", (now or datetime.datetime.now()).strftime("%Y-%m-%d_%H-%M-%S"))
    return Settings(
        budget_s=float(budget), steps=block["steps"], warmup_steps=block["warmup_steps"],
        micro_batch_sizes=None if micro is None else list(dict.fromkeys(micro)),  # a size given twice: once
        strategies=list(strategies), activation_checkpointing=None if ckpt is None else list(dict.fromkeys(ckpt)),
        out_dir=Path(out_dir).resolve(), tp_degrees=None if tp is None else list(dict.fromkeys(tp)),
    )


def load_job(argv: list[str]) -> Job:
    """Split, compose and check: the autotuner's whole input."""
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    run, tune = split_overrides(argv)
    try:
        config = compose(run + tune)
    except (HydraException, OmegaConfBaseException) as error:  # Hydra's message names the bad override
        raise AutotuneError(" ".join(str(error).split())) from error
    block = OmegaConf.to_container(config.autotune, resolve=True)
    return Job(overrides=run, config=config, settings=check_settings(block))
