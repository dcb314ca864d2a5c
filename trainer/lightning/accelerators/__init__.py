"""Lightning's ``lightning.pytorch.accelerators``, for what a program reads of the machine: ``cuda.py``
has ``num_cuda_devices()`` and ``is_cuda_available()``, which the mirror's ``Trainer`` reads when it is
built (so a program or test that patches ``num_cuda_devices`` there, as Lightning's tests patch
Lightning's, builds the Trainer Lightning would). An accelerator is chosen with
``Trainer(accelerator="cpu" / "cuda" / "gpu" / "auto")``; Lightning's accelerator classes are an
ImportError saying so.
"""

from trainer.lightning._missing import missing_names
from trainer.lightning.accelerators import cuda

__all__ = ["cuda"]

_USE_A_NAME = "Trainer(accelerator='cpu' / 'cuda' / 'gpu' / 'auto')"
__getattr__ = missing_names(__name__, {name: _USE_A_NAME for name in (
    "Accelerator", "CPUAccelerator", "CUDAAccelerator", "MPSAccelerator", "XLAAccelerator", "find_usable_cuda_devices")})
