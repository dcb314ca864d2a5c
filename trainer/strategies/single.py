"""One process on one device: the reference every other strategy must match."""

from trainer.strategies.base import Strategy


class SingleDeviceStrategy(Strategy):
    """Train in this process on one device (the GPU if there is one, else the CPU)."""

    name = "single"
