"""Lightning's ``lightning.pytorch.accelerators.cuda``: how many CUDA devices this process can use.

The mirror's ``Trainer`` calls ``num_cuda_devices`` of this module each time one is built
(``accelerator="cuda"`` / ``"gpu"`` refused when it says 0, ``devices="auto"`` that many), so a
patch of it is seen as Lightning's Trainer sees a patch of Lightning's. Without one it is torch's
count: on a machine without CUDA, ``Trainer(accelerator="gpu")`` is refused before any worker
starts. The device a rank trains on is always torch's answer.
"""

from __future__ import annotations

from trainer.lightning._missing import missing_names

__all__ = ["is_cuda_available", "num_cuda_devices"]


def num_cuda_devices() -> int:
    """The CUDA devices this process can use (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def is_cuda_available() -> bool:
    """Whether this process can use a CUDA device (``num_cuda_devices() > 0``)."""
    return num_cuda_devices() > 0


__getattr__ = missing_names(__name__, {"CUDAAccelerator": "Trainer(accelerator='cuda' / 'gpu')",
                                       "find_usable_cuda_devices": "Trainer(devices=N) or CUDA_VISIBLE_DEVICES"})
