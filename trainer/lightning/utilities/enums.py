"""Lightning's ``lightning.pytorch.utilities.enums``: ``GradClipAlgorithmType``, the two ways
``gradient_clip_val`` clips, equal to their strings ("norm", "value"), which this trainer takes too."""

from __future__ import annotations

from enum import Enum


class GradClipAlgorithmType(str, Enum):
    """``"norm"``: the global 2-norm of the gradients; ``"value"``: each element to ``[-val, val]``."""

    VALUE = "value"
    NORM = "norm"

    def __eq__(self, other: object) -> bool:  # (any case, as Lightning's enums)
        return isinstance(other, str) and other.lower() == self.value

    def __hash__(self) -> int:
        return hash(self.value)
