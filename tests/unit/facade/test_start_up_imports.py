"""Start-up cost: every module a run imports is paid by every process (each rank too). Importing the
trainer and resolving a strategy by name import none of the heavy modules a plain run never uses:
torch.distributed.checkpoint (with DTensor, FSDP and sympy about a second, imported by the saves
that use it) and OmegaConf (a tenth of a second, for the yamls of added config directories only)."""

import json
import subprocess
import sys

from tests.support.helpers import REPO

_PROGRAM = """
import json, sys
import torch, torch.nn.functional, torch.utils.data
before = set(sys.modules)
import trainer
imported = set(sys.modules) - before
from trainer.strategies.registry import resolve_strategy
resolve_strategy("single"), resolve_strategy("ddp")
print(json.dumps({"import": sorted(imported), "resolve": sorted(set(sys.modules) - before - imported)}))
"""
HEAVY = ("torch.distributed.checkpoint", "torch.distributed.tensor", "torch.distributed.fsdp", "sympy", "omegaconf")


def test_importing_the_trainer_and_resolving_a_strategy_import_no_heavy_module():
    result = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True, timeout=120, cwd=REPO,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": REPO})
    assert result.returncode == 0, result.stderr
    modules = json.loads(result.stdout)
    for stage in ("import", "resolve"):
        heavy = [m for m in modules[stage] if m.split(".")[0] in HEAVY or m.startswith(HEAVY)]
        assert heavy == [], (stage, heavy)
    assert any(m.startswith("trainer.strategies.ddp") for m in modules["resolve"])  # (it did resolve)
