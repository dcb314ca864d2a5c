"""``python -m trainer.cli``: the ``trainer`` command, as ``python -m trainer``."""

import sys

from trainer.cli.command import main

if __name__ == "__main__":
    sys.exit(main())
