"""The shared same-training assertion (tests/support/same_training.py) fails on each kind of difference."""

import pytest
import torch

from tests.support.same_training import assert_same_training

TOL = dict(rtol=1e-5, atol=1e-6)


def test_same_training_passes_within_and_fails_outside_the_tolerance():
    reference = ([1.0, 0.5], {"w": torch.ones(2), "b": torch.zeros(1)})
    assert_same_training(([1.0 + 5e-7, 0.5], {"w": torch.ones(2), "b": torch.full((1,), 5e-7)}), reference, steps=2, tol=TOL)
    cases = {
        "losses": ([1.0, 0.6], reference[1]),
        "parameter w": (reference[0], {"w": torch.tensor([1.0, 1.1]), "b": torch.zeros(1)}),
        "parameter names": (reference[0], {"w": torch.ones(2)}),
        "expected 3": reference,  # the step count
    }
    for message, run in cases.items():
        with pytest.raises(AssertionError, match=message):
            assert_same_training(run, reference, steps=3 if message == "expected 3" else 2, tol=TOL)
