"""Lightning's ``lightning.pytorch.utilities.exceptions``: ``MisconfigurationException``."""

from trainer.api.errors import MisconfigurationException

__all__ = ["MisconfigurationException"]
