import os
import sys

# tests/helpers.py is imported by name, also inside workers the trainer spawns.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pytest  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _warm_fork_server():
    """One fork server for the session, started before any test spawns ranks, with torch, its
    compiler stack, the trainer and the helpers imported (tests/warm_process.py start_fork_server):
    each 2-rank run then starts in a fork, not in seconds of imports per rank."""
    from warm_process import start_fork_server

    start_fork_server()


def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.gpu`` tests run where CUDA is available and are skipped (with the reason
    shown by ``-ra``) elsewhere."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
