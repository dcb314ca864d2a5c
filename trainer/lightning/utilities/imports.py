"""Lightning's flags for optional packages (``lightning.pytorch.utilities.imports``)."""

from importlib.util import find_spec

_TORCHVISION_AVAILABLE = find_spec("torchvision") is not None
_TORCHMETRICS_AVAILABLE = find_spec("torchmetrics") is not None
_OMEGACONF_AVAILABLE = find_spec("omegaconf") is not None
_RICH_AVAILABLE = find_spec("rich") is not None
