"""``test`` / ``predict`` on an ``IterableDataset`` (with and without ``__len__``, with and without
``limit_*_batches``) on 2 ranks equal one process: the same test means (rtol 1e-6: a sum over ranks in
another order) and the same predictions in stream order; under FSDP (forwards in lockstep) the rank
with fewer batches pads with weight-0 forwards that count for nothing. One process against Lightning:
tests/unit/api/test_lightning_loader_kinds.py."""

from __future__ import annotations

import pytest
import torch

import trainer.lightning as L
from tests.support.loader_kinds_modules import Ready

pytestmark = pytest.mark.timeout(600)


def _evaluate(tmp_path, kind, limit, **flags):
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(tmp_path), limit_test_batches=limit, limit_predict_batches=limit, **flags)
    tested = trainer.test(Ready(kind=kind), verbose=False)
    return tested[0]["t"], torch.cat(trainer.predict(Ready(kind=kind)))


@pytest.mark.parametrize("kind, limit, strategy", [("stream", None, "ddp"), ("sized_stream", 3, "fsdp")])
def test_a_test_and_predict_stream_on_two_ranks_equals_one_process(tmp_path, kind, limit, strategy):
    tested, predicted = _evaluate(tmp_path / "one", kind, limit)
    tested2, predicted2 = _evaluate(tmp_path / "two", kind, limit, strategy=strategy, devices=2, accelerator="cpu")
    assert tested2 == pytest.approx(tested, rel=1e-6)
    assert len(predicted) == min(10, 3 * (limit or 4))  # 10 samples in batches of 3
    torch.testing.assert_close(predicted2, predicted, rtol=1e-6, atol=1e-7)
