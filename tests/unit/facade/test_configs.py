"""Every option of every config group composes, resolves and builds.

The groups and their options are discovered from the yaml files in ``conf/`` (nothing is listed
by hand): a new ``conf/<group>/<option>.yaml`` is picked up automatically. Combinations of one
option per group, chosen so that every option of a group meets every option of every other group in at
least one of them (all pairs: about 30 combinations, where the whole product is several hundred that
repeat each pair's check many times), are composed with Hydra's compose API, resolved once (as ``train.py`` does)
and instantiated with ``trainer.cli.hydra_app.build``; the optimizer and scheduler factories are then
called on the module's real parameters. Nothing is trained and no process is started, so this
runs in seconds.

A group the primary config selects as a list (``logger: [jsonl, tensorboard]``, ``callbacks: []``:
several options at once) stays out of that product, which it would multiply: each of its options is composed
alone, and all of them together, with the other groups' defaults.
"""

from __future__ import annotations

import itertools
import os

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from hydra.utils import get_class
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

import trainer
from tests.support.helpers import REPO
from trainer.cli.hydra_app import build

CONF_DIR = os.path.join(REPO, "conf")
PRIMARY = "config"
YAML_SUFFIXES = (".yaml", ".yml")
# Groups that lead the test ids when present; any other group follows in alphabetical order.
ID_ORDER = ("recipe", "strategy", "optimizer", "scheduler")


def discover_groups() -> dict[str, list[str]]:
    """``{group: [option, ...]}`` from ``conf/<group>/<option>.yaml``."""
    groups: dict[str, list[str]] = {}
    for group in sorted(os.listdir(CONF_DIR)):
        path = os.path.join(CONF_DIR, group)
        if not os.path.isdir(path) or group.startswith((".", "_")):
            continue
        options = sorted(os.path.splitext(name)[0] for name in os.listdir(path) if name.endswith(YAML_SUFFIXES))
        if options:
            groups[group] = options
    return dict(sorted(groups.items(), key=lambda item: (ID_ORDER.index(item[0]) if item[0] in ID_ORDER else len(ID_ORDER), item[0])))


def discover_multi_select_groups() -> set[str]:
    """Groups whose default in the primary config's defaults list is a list of options."""
    defaults = OmegaConf.load(os.path.join(CONF_DIR, PRIMARY + ".yaml")).get("defaults", [])
    return {group for entry in defaults if isinstance(entry, DictConfig)
            for group, choice in entry.items() if isinstance(choice, ListConfig)}


MULTI_SELECT = discover_multi_select_groups()
GROUPS = discover_groups()
SINGLE_GROUPS = {group: options for group, options in GROUPS.items() if group not in MULTI_SELECT}


def all_pairs(groups: dict[str, list[str]]) -> list[list[str]]:
    """Combinations of one option per group in which every option of each group appears with every
    option of every other group at least once (greedy, deterministic): what two yaml files do to each
    other shows in a pair; three groups that only break together are not looked for."""
    names = list(groups)
    order = {name: index for index, name in enumerate(names)}

    def pair(one: tuple[str, str], other: tuple[str, str]) -> tuple:
        return (one, other) if order[one[0]] < order[other[0]] else (other, one)

    uncovered = {pair((a, x), (b, y)) for i, a in enumerate(names) for b in names[i + 1:]
                 for x in groups[a] for y in groups[b]}
    rows = []
    while uncovered:
        (a, x), (b, y) = min(uncovered)  # one pair still missing seeds the next combination
        row = {a: x, b: y}
        for group in names:
            if group not in row:  # the option that meets the most missing pairs (the first on a tie)
                row[group] = max(groups[group], key=lambda option: sum(
                    pair((group, option), (other, chosen)) in uncovered for other, chosen in row.items()))
        uncovered -= {pair((g, row[g]), (h, row[h])) for i, g in enumerate(names) for h in names[i + 1:]}
        rows.append([f"{group}={row[group]}" for group in names])
    return rows


# Every option of every group composed with every option of every other group (each recipe with each
# strategy, optimizer, scheduler and precision), in combinations of one option per group.
COMBINATIONS = all_pairs(SINGLE_GROUPS)
# Multi-select groups: each option alone, then all of them at once.
SELECTIONS = [(group, [option]) for group in sorted(MULTI_SELECT) for option in GROUPS.get(group, [])] + [
    (group, GROUPS[group]) for group in sorted(MULTI_SELECT) if len(GROUPS.get(group, [])) > 1
]


def compose_config(overrides: list[str], return_hydra_config: bool = False):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(PRIMARY, overrides=overrides, return_hydra_config=return_hydra_config)


def test_discovery_found_the_groups():
    # Guards against a moved conf/ turning the parametrized test below into zero cases.
    assert os.path.isfile(os.path.join(CONF_DIR, PRIMARY + ".yaml"))
    for group in ID_ORDER:
        assert GROUPS.get(group), f"no options found for group {group!r} in {CONF_DIR}"
    assert {"logger", "callbacks"} <= MULTI_SELECT
    met = {(one, other) for combination in COMBINATIONS for one in combination for other in combination}
    for (a, options_a), (b, options_b) in itertools.combinations(SINGLE_GROUPS.items(), 2):
        for x, y in itertools.product(options_a, options_b):
            assert (f"{a}={x}", f"{b}={y}") in met, f"{a}={x} never composed with {b}={y}"
    selected = {override for combination in COMBINATIONS for override in combination}
    selected |= {f"{group}={option}" for group, options in SELECTIONS for option in options}
    for group, options in GROUPS.items():
        for option in options:
            assert f"{group}={option}" in selected


@pytest.fixture(scope="module")
def hf_model_dirs(tmp_path_factory):
    """A tiny random Llama's and BERT's configs (the hf recipes need model.path: a local directory)."""
    from tests.support.hf_models import bert_config, llama_config

    directories = {}
    for recipe, config in (("hf_causal_lm", llama_config()), ("hf_sequence_classification", bert_config())):
        directories[recipe] = str(tmp_path_factory.mktemp(recipe))
        config.save_pretrained(directories[recipe])
    return directories


@pytest.mark.parametrize("overrides", COMBINATIONS, ids=[",".join(c) for c in COMBINATIONS])
def test_config_composes_and_builds(overrides, tmp_path, request):
    # The options really are the selected ones (a recipe's defaults must not override the command line).
    hf_recipes = [o.split("=", 1)[1] for o in overrides if o.startswith("recipe=hf_")]
    required = [f"model.path={request.getfixturevalue('hf_model_dirs')[r]}" for r in hf_recipes]
    cfg = compose_config(overrides + required, return_hydra_config=True)
    choices = cfg.hydra.runtime.choices
    for override in overrides:
        group, option = override.split("=", 1)
        assert choices[group] == option, f"{override} was not selected: hydra chose {group}={choices[group]}"

    # compose() without return_hydra_config is this same composition with the hydra node deleted
    # (hydra/compose.py): done here, so each combination is composed once, not twice.
    with open_dict(cfg):
        del cfg["hydra"]
    container = OmegaConf.to_container(cfg, resolve=True)
    assert "hydra" not in container

    built_trainer, module = build(container, run_dir=str(tmp_path))
    assert isinstance(built_trainer, trainer.Trainer)
    assert isinstance(module, trainer.TrainModule)
    assert isinstance(module, get_class(container["module"]["_target_"]))
    assert isinstance(built_trainer.strategy, get_class(container["strategy"]["_target_"]))
    assert built_trainer.run_dir == str(tmp_path)
    assert built_trainer.world_size == 1  # the ddp option with devices=1: built, nothing spawned

    module.configure_model()
    parameters = list(module.parameters())
    assert parameters, f"{type(module).__name__} has no parameters after configure_model()"

    optimizer = module.optimizer_factory(module.parameters())
    assert isinstance(optimizer, torch.optim.Optimizer)
    assert isinstance(optimizer, get_class(container["optimizer"]["_target_"]))
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(parameters)
    if "lr" in container["optimizer"]:
        assert optimizer.param_groups[0]["lr"] == pytest.approx(container["optimizer"]["lr"])

    if container.get("scheduler") is None:
        assert module.scheduler_factory is None
    else:
        scheduler = module.scheduler_factory(optimizer)
        assert isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler)
        optimizer.step()  # no gradients: a no-op, but keeps the scheduler's step order check quiet
        scheduler.step()

    # The path the trainer itself takes (a list of optimizers under manual optimization: recipe=gan).
    from trainer.optim.optimizers import configure_optimizers

    optimizers, _ = configure_optimizers(module)
    for optimizer in optimizers if isinstance(optimizers, list) else [optimizers]:
        assert isinstance(optimizer, torch.optim.Optimizer)


@pytest.mark.parametrize("group, options", SELECTIONS, ids=[f"{g}=[{','.join(o)}]" for g, o in SELECTIONS])
def test_multi_select_group_composes_and_builds(group, options, tmp_path):
    # Each option's file holds one node named after the option (``csv: {filename: ...}``), so
    # selecting several merges them side by side under the group, in the order selected.
    container = OmegaConf.to_container(compose_config([f"{group}=[{','.join(options)}]"]), resolve=True)
    assert list(container[group]) == options
    built_trainer, _ = build(container, run_dir=str(tmp_path))
    if group == "logger":  # the Trainer checked every option against its backend
        assert built_trainer.logger_specs == [(option, container[group][option]) for option in options]
    if group == "callbacks":  # one instance per option, of its _target_, in the order selected
        assert [type(callback) for callback in built_trainer.callbacks] == [
            get_class(container[group][option]["_target_"]) for option in options
        ]


@pytest.mark.parametrize(
    "overrides, match",
    [
        (["trainer.max_stepz=1"], "max_stepz"),  # misspelt key: struct mode rejects it
        (["strategy=nope"], "nope"),  # unknown group option
        (["logger=[jsonl,nope]"], "logger/nope"),  # unknown option in a multi-select group
        (["logger.csv.filename=x.csv"], "csv"),  # options of a logger that is not selected
        (["callbacks.early_stopping.monitor=val/loss"], "callbacks"),  # a callback that is not selected
        (["callbacks=[early_stopping]", "callbacks.early_stopping.monitr=x"], "monitr"),  # misspelt option
    ],
    ids=["misspelt-key", "unknown-option", "unknown-logger", "unselected-logger-option", "unselected-callback-option",
         "misspelt-callback-option"],
)
def test_bad_override_fails_at_compose_time(overrides, match):
    with pytest.raises((HydraException, OmegaConfBaseException), match=match):
        compose_config(overrides)
