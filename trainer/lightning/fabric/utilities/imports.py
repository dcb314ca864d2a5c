"""Lightning's platform flags (``lightning.fabric.utilities.imports``)."""

import platform
import sys

_IS_WINDOWS = platform.system() == "Windows"
_IS_INTERACTIVE = hasattr(sys, "ps1") or bool(sys.flags.interactive)
