"""``python -m trainer.checkpoint consolidate PATH OUT``: full weights of a checkpoint in one file."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None, prog: str = "python -m trainer.checkpoint") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    merge = commands.add_parser("consolidate", help="write a checkpoint's full model weights to one torch file")
    merge.add_argument("path", help="a checkpoint directory, or a directory of checkpoints (the latest is used)")
    merge.add_argument("out", help="output file, e.g. model.pt (a {name: tensor} state dict)")
    args = parser.parse_args(argv)

    from trainer.checkpoint import CheckpointError, consolidate

    try:
        weights = consolidate(args.path, args.out)
    except (CheckpointError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    total = sum(t.numel() * t.element_size() for t in weights.values())
    print(f"wrote {len(weights)} tensors ({total / 1e6:.1f} MB) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
