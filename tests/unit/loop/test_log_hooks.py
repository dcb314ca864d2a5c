"""Which hook a ``self.log`` call comes from: frames of the trainer's own code are skipped, frames of the
recipes (shipped inside the package, but modules like a user's) are not."""

import os

from trainer.loop import log_hooks


def _hook_from(filename: str):
    """``calling_hook()`` as seen from a ``validation_step`` whose code lives in ``filename``."""
    source = "def validation_step():\n    return calling_hook(depth=1)\n"
    names = {"calling_hook": log_hooks.calling_hook}
    exec(compile(source, filename, "exec"), names)
    return names["validation_step"]()


def test_a_recipe_hook_is_found():
    recipe_file = os.path.join(os.path.dirname(os.path.dirname(log_hooks.__file__)), "recipes", "gpt.py")
    assert _hook_from(recipe_file) == ("validation_step", "validation_step")


def test_the_trainers_own_frames_are_skipped():
    own_file = os.path.join(os.path.dirname(log_hooks.__file__), "validation.py")
    assert _hook_from(own_file)[0] is None  # the trainer's frame is skipped; no hook above it
    assert _hook_from("/elsewhere/my_module.py") == ("validation_step", "validation_step")
