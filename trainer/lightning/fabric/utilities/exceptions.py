"""Lightning's ``lightning.fabric.utilities.exceptions``: ``MisconfigurationException`` (the same class
as ``lightning.pytorch``'s)."""

from trainer.api.errors import MisconfigurationException

__all__ = ["MisconfigurationException"]
