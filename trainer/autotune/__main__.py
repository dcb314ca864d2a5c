"""``python -m trainer.autotune recipe=mlp trainer.devices=2 autotune.budget_s=300 [overrides]``.

Exit status: 0 with a best config written, 1 when no candidate ran through, 2 for a setting the
autotuner refuses (one line, ``error: ...``).
"""

from __future__ import annotations

import sys

from trainer.autotune.runner import autotune
from trainer.autotune.settings import AutotuneError


def main(argv: list[str] | None = None) -> int:
    try:
        outcome = autotune(sys.argv[1:] if argv is None else argv)
    except AutotuneError as error:
        print("error: " + " ".join(str(error).split()), file=sys.stderr)
        return 2
    return 0 if outcome.best is not None else 1


if __name__ == "__main__":
    from trainer.cli.project_dir import use_project_dir

    use_project_dir()  # as under the trainer command: the folder's conf/ and modules are found
    sys.exit(main())
