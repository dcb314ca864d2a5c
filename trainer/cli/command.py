"""usage: trainer [OVERRIDES ...]           train: what `python train.py` runs (recipe=mlp strategy=ddp ...)
       trainer COMMAND [ARGS ...]

Training takes Hydra overrides (key=value, +key=value, ~key) and Hydra's flags (-m for a multirun,
--config-dir DIR, --cfg job, ...); `trainer train --help` shows Hydra's help for the configs.
Under torchrun or srun every rank runs the command (torchrun ... -m trainer recipe=mlp).

commands:
  estimate [OVERRIDES]      will the run fit? bytes per rank for every strategy (nothing is trained)
  dry-run [OVERRIDES]       one rank of a strategy=nd layout on a fake process group: its shards and memory
  autotune [OVERRIDES]      try strategies and batch splits for a few steps each; write the best config
  consolidate CKPT OUT      a checkpoint's full model weights in one torch file
                            (--format hf --model DIR: a directory transformers' from_pretrained reads)
  prepare-text IN OUT       tokenize text files into token shards (then: trainer data.tokens=OUT)
  init DIR                  start a project of your own: a module, its data, conf/ and a test

In a folder with a conf/ directory (a project from `trainer init`), its configs compose with the
built-in ones and its modules import by name.
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence


def _estimate(argv: list[str]) -> int:
    from trainer.estimate.__main__ import main

    return main(argv)


def _dry_run(argv: list[str]) -> int:
    from trainer.estimate.dry_run_command import main

    return main(argv)


def _autotune(argv: list[str]) -> int:
    from trainer.autotune.__main__ import main

    return main(argv)


def _consolidate(argv: list[str]) -> int:
    if any(arg == "--format" or arg.startswith("--format=") for arg in argv):
        from trainer.hf.export import main as export_main  # --format hf: a directory from_pretrained reads

        return export_main(argv)
    from trainer.checkpoint.__main__ import main

    return main(["consolidate", *argv], prog="trainer")


def _prepare_text(argv: list[str]) -> int:
    from trainer.recipes.prepare_text import main

    return main(argv)


def _init(argv: list[str]) -> int:
    from trainer.cli.init_project import main

    return main(argv)


def _train(argv: list[str]) -> int:
    from trainer.cli.train import train

    train(argv)  # exits with the job's status
    return 0


#: subcommand -> its entry point (argv after the name -> exit status)
COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "train": _train,
    "estimate": _estimate,
    "dry-run": _dry_run,
    "autotune": _autotune,
    "consolidate": _consolidate,
    "prepare-text": _prepare_text,
    "init": _init,
}


def is_training_argument(arg: str) -> bool:
    """A Hydra override or flag, never a command name: overrides hold ``=`` (``recipe=mlp``) or start
    with ``+`` / ``~`` (``+x=1``, ``~logger``), flags with ``-``."""
    return "=" in arg or arg.startswith(("-", "+", "~"))


def main(argv: Sequence[str] | None = None) -> int:
    """The ``trainer`` console script and ``python -m trainer``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help", "help"):
        print(__doc__.strip())
        return 0
    training = not argv or is_training_argument(argv[0])
    name, rest = ("train", argv) if training else (argv[0], argv[1:])
    if name not in COMMANDS:
        print(f"error: {name!r} is neither a trainer command nor an override (key=value); the commands are "
              f"{', '.join(COMMANDS)}; see trainer --help", file=sys.stderr)
        return 2
    from trainer.cli.project_dir import use_project_dir

    use_project_dir()
    return COMMANDS[name](rest)
