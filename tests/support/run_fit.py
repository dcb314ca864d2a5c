"""Run one ``helpers.run_trainer`` in its own process (for runs a test kills or signals):

    python tests/support/run_fit.py '{"run_dir": ..., "module": {"kill_at_step": 8}, "trainer": {...}}'

``run_fit`` runs the same spec in a process forked from a warm server (tests/support/warm_process.py),
without the seconds a fresh interpreter spends importing torch; torchrun runs this file itself.
"""

import json
import os
import sys

# Run as a script: the repository root on the path, so that `tests.support` imports.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.support.helpers import REPO  # noqa: E402


def main(spec: dict) -> None:
    from tests.support.helpers import CheckpointedRegressor, run_trainer

    from trainer.strategies import resolve_strategy

    strategy = spec.get("trainer", {}).get("strategy")
    if isinstance(strategy, dict):  # {"name": "ddp", "zero1": true}
        spec["trainer"]["strategy"] = resolve_strategy(strategy.pop("name"), **strategy)
    module_class = CheckpointedRegressor
    if "module_class" in spec:  # "tests.support.stream_modules.StreamRegressor": a module of another test file
        import importlib

        module_name, class_name = spec["module_class"].rsplit(".", 1)
        module_class = getattr(importlib.import_module(module_name), class_name)
    run_trainer(spec["run_dir"], module_class(**spec.get("module", {})), **spec.get("trainer", {}))


def run_fit(spec: dict, timeout: float):
    """``python tests/support/run_fit.py <spec>`` run from the repository root with its output captured
    (``subprocess.run``'s ``CompletedProcess``), in a warm process of its own."""
    from tests.support.warm_process import run_in_warm_process

    text = json.dumps(spec)  # the spec as the command line gives it: JSON types only
    return run_in_warm_process(main, (json.loads(text),), timeout=timeout, cwd=REPO,
                               description=[sys.executable, os.path.join(REPO, "tests", "support", "run_fit.py"), text])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
