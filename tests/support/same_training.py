"""The same-training assertion shared by the equivalence tests (test_equivalence.py, test_fsdp.py,
test_pipeline.py): two runs are the same training when every step's loss and every final parameter
agree within a tolerance the test states (its docstring says why that tolerance holds there).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch


def assert_same_training(run: tuple[list[float], dict], reference: tuple[list[float], dict], *, steps: int,
                         tol: Mapping[str, Any]) -> None:
    """Assert that ``run`` trained as ``reference`` did. Each is ``(per-step losses, final parameters)``
    as ``helpers.fit`` returns it. Both logged ``steps`` losses, equal within ``tol`` (``rtol`` /
    ``atol`` of ``torch.testing.assert_close``, relative to the reference's values); both hold the
    same parameter names; each of ``run``'s parameters is a full tensor (not a DTensor shard) equal
    to the reference's within ``tol``."""
    losses, params = run
    reference_losses, reference_params = reference
    assert len(losses) == len(reference_losses) == steps, (
        f"{len(losses)} and {len(reference_losses)} logged losses; expected {steps} each")
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference_losses), **tol,
                               msg=lambda detail: f"per-step losses differ: {detail}")
    assert params.keys() == reference_params.keys(), (
        f"parameter names differ: {sorted(params.keys() ^ reference_params.keys())}")
    for name in params:
        assert not hasattr(params[name], "placements"), f"{name} is a DTensor, not a full tensor"
        torch.testing.assert_close(params[name], reference_params[name], **tol, msg=f"parameter {name} differs")
