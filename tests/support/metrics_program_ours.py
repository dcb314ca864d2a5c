"""tests/support/metrics_program.py with its Lightning import rewritten to this trainer's names and
nothing else (executed here, so its classes live in this module: spawned workers import them)."""

import os

_SOURCE = os.path.join(os.path.dirname(__file__), "metrics_program.py")
with open(_SOURCE) as _f:
    _text = _f.read()
_text = _text.replace("import lightning.pytorch as L\n", "import tests.support.lightning_names_shim as L\n")
exec(compile(_text, _SOURCE, "exec"), globals())
