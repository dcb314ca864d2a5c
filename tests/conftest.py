import os
import sys

# tests/helpers.py is imported by name, also inside workers the trainer spawns.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.gpu`` tests run where CUDA is available and are skipped (with the reason
    shown by ``-ra``) elsewhere."""
    import pytest
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
