"""``python -m trainer``: the ``trainer`` command (see ``trainer --help``)."""

import sys

from trainer.cli.command import main

if __name__ == "__main__":
    sys.exit(main())
