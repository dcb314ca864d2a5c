"""Strategy yamls read without OmegaConf where they are the package's own: the same values."""

import glob
import os

import pytest
from omegaconf import OmegaConf

from trainer.runtime.config_dir import builtin_config_dir
from trainer.strategies import registry

PACKAGED = sorted(glob.glob(os.path.join(str(builtin_config_dir()), registry.GROUP, "*.yaml")))


def test_the_package_has_strategy_yamls():
    assert len(PACKAGED) >= 4, PACKAGED  # single, ddp, fsdp, pipeline: the parametrized test below is not empty


@pytest.mark.parametrize("path", PACKAGED)
def test_the_packaged_yamls_read_as_omegaconf_reads_them(path, monkeypatch):
    import yaml

    seen = []
    monkeypatch.setattr(yaml, "safe_load", lambda f, _load=yaml.safe_load: seen.append(1) or _load(f))
    assert registry._read(path) == OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    assert seen, "the package's own yaml was not read with PyYAML"


def test_a_yaml_of_an_added_directory_is_read_by_omegaconf(tmp_path, monkeypatch):
    # (PyYAML alone would read 1e-3 as a string, and a date as a date)
    (tmp_path / registry.GROUP).mkdir()
    (tmp_path / registry.GROUP / "mine.yaml").write_text(
        "_target_: trainer.strategies.single.SingleDeviceStrategy\nlr: 1e-3\nsince: 2026-11-25\n")
    monkeypatch.setattr(registry, "_extra_dirs", [])
    registry.add_config_dir(str(tmp_path))
    assert registry.yaml_values("mine") == {"lr": 0.001, "since": "2026-11-25"}
    assert registry.strategy_class("mine").__name__ == "SingleDeviceStrategy"
