"""``python -m trainer.estimate [train.py's overrides] [estimate.device_memory_gb=80]``: will it fit?

Composes the config as ``train.py`` does (conf/estimate.yaml = conf/config.yaml + the ``estimate``
block), checks its keys with the same check (trainer/cli/hydra_app.py ``check_config_keys``), builds the
module on fake tensors (no memory) and prints the configured strategy's bytes per rank, then the
comparison of every strategy. Nothing is trained and no process group is made.
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence

from trainer.cli.hydra_errors import describe
from trainer.estimate import estimate_config
from trainer.runtime.config_dir import builtin_config_dir


def compose(overrides: Sequence[str], config_name: str = "estimate"):
    """The composed config (conf/<config_name>.yaml with ``overrides``), as Hydra composes train.py's."""
    from hydra import compose as hydra_compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(builtin_config_dir()), version_base="1.3"):
        try:
            return hydra_compose(config_name=config_name, overrides=list(overrides))
        except Exception as error:  # a mistyped key or option: train.py's one line (the groups are known here)
            message = describe(error)
            if message is None:
                raise
            raise ValueError(message) from None


def run_tool(argv: Sequence[str], doc: str | None, report: Callable[[Sequence[str]], str]) -> int:
    """A planning command's main: ``--help`` prints ``doc``; the report, or its error in one line
    (exit status 2), as train.py's config errors."""
    if any(a in ("-h", "--help") for a in argv):
        print(doc)
        return 0
    try:
        text = report(argv)
    except Exception as error:  # a bad override or value
        print(f"error: {type(error).__name__}: {error}", file=sys.stderr)
        return 2
    print(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_tool(sys.argv[1:] if argv is None else argv, __doc__, lambda args: estimate_config(compose(args)))


if __name__ == "__main__":
    from trainer.cli.project_dir import use_project_dir

    use_project_dir()  # as under the trainer command: the folder's conf/ and modules are found
    sys.exit(main())
