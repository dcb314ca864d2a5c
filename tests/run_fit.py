"""Run one ``helpers.run_trainer`` in its own process (for runs a test kills or signals):

    python tests/run_fit.py '{"run_dir": ..., "module": {"kill_at_step": 8}, "trainer": {...}}'
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
    from helpers import CheckpointedRegressor, run_trainer

    from trainer.strategies import resolve_strategy

    spec = json.loads(sys.argv[1])
    strategy = spec.get("trainer", {}).get("strategy")
    if isinstance(strategy, dict):  # {"name": "ddp", "zero1": true}
        spec["trainer"]["strategy"] = resolve_strategy(strategy.pop("name"), **strategy)
    module_class = CheckpointedRegressor
    if "module_class" in spec:  # "stream_modules.StreamRegressor": a module of another test file
        import importlib

        module_name, class_name = spec["module_class"].rsplit(".", 1)
        module_class = getattr(importlib.import_module(module_name), class_name)
    run_trainer(spec["run_dir"], module_class(**spec.get("module", {})), **spec.get("trainer", {}))
