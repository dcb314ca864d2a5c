"""The programs of tests/support/lightning_programs/ with their import lines rewritten to
``trainer.lightning``: ``tests.support.lightning_as_ours.<name>`` is ``lightning_programs/<name>.py``
ported (tests/support/lightning_rewrite.py). Importing this package installs the finder, so a spawned
rank that unpickles a ported program's class finds it too."""

import os

from tests.support.lightning_rewrite import install

install(__name__, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lightning_programs"))
