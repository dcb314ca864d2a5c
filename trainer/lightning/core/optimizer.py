"""``LightningOptimizer``: what ``self.optimizers()`` returns, an instance of the wrapped optimizer's
class whose ``step()`` goes through the strategy and precision (``trainer/api/optimizer.py``)."""

from trainer.api.optimizer import LightningOptimizer

__all__ = ["LightningOptimizer"]
