"""``LightningOptimizer``: the wrapper ``self.optimizers()`` returns under manual optimization
(its ``step()`` goes through the strategy and precision; see trainer/loop/manual_step.py)."""

from trainer.loop.manual_step import ManualOptimizer as LightningOptimizer

__all__ = ["LightningOptimizer"]
