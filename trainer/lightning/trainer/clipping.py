"""``trainer.gradient_clip_algorithm`` as Lightning's Trainer has it: the value given, None when not
given (this trainer's own Trainer resolves it to "norm", which is also what clipping does here)."""

from __future__ import annotations

from typing import Any


class LightningClipSetting:
    """A mixin of the mirror's ``Trainer``."""

    @property
    def gradient_clip_algorithm(self) -> str | None:
        """"norm", "value", or None when not given (then ``gradient_clip_val`` clips by the norm)."""
        return self.__dict__.get("gradient_clip_algorithm_arg")

    @gradient_clip_algorithm.setter
    def gradient_clip_algorithm(self, value: Any) -> None:
        self.__dict__["resolved_gradient_clip_algorithm"] = value  # (the base's "norm" default, kept apart)
