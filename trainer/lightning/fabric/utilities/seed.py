"""Lightning's ``lightning.fabric.utilities.seed``: ``seed_everything``."""

from trainer.lightning.seed import seed_everything

__all__ = ["seed_everything"]
