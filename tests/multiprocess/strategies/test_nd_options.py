"""strategy=nd (tensor parallel 2) with the trainer's other options, each compared with one process
(CPU fp32: rtol=1e-5 / atol=1e-6, as test_nd.py; fp16 with measured bounds): ``self.log`` of DTensor
values, manual optimization, fp16-mixed, trainer.compile."""

from __future__ import annotations

import pytest
import torch

from tests.support.helpers import fit, read_metrics, run_trainer
from tests.support.nd_modules import LoggingClassifier, ManualClassifier, TokenClassifier
from tests.support.same_training import assert_same_training
from trainer.strategies.nd import NDStrategy

pytestmark = pytest.mark.timeout(300)
TOL = dict(rtol=1e-5, atol=1e-6)
STEPS = 4


def _logged(run_dir, name):
    return torch.tensor([r[name] for r in read_metrics(str(run_dir)) if name in r])


def test_self_log_of_a_dtensor_logs_its_whole_value(tmp_path):
    # Under loss parallel the logits are sharded on the vocabulary: their mean and max are DTensors,
    # logged as the whole value (the mean over all classes, not over this rank's half).
    run_trainer(tmp_path / "nd", LoggingClassifier(), strategy=NDStrategy(tp=2), devices=2, batch_size=8,
                max_steps=STEPS, limit_train_batches=STEPS)
    run_trainer(tmp_path / "single", LoggingClassifier(), strategy="single", devices=1, batch_size=8,
                max_steps=STEPS, limit_train_batches=STEPS)
    for name in ("logged_logit_mean", "logged_logit_max_step", "logged_logit_max_epoch"):
        single = _logged(tmp_path / "single", name)
        assert len(single) == (1 if name.endswith("epoch") else STEPS), name
        torch.testing.assert_close(_logged(tmp_path / "nd", name), single, **TOL, msg=name)


def test_manual_optimization_tp2_equals_one_process(tmp_path):
    # manual_backward under loss parallel (the logits sharded on the vocabulary), clip_gradients by the
    # norm over the tensor-parallel shards, the optimizer's step on DTensor parameters.
    result = fit(tmp_path / "nd", ManualClassifier(), strategy=NDStrategy(tp=2), devices=2, batch_size=8,
                 max_steps=STEPS)
    reference = fit(tmp_path / "single", ManualClassifier(), strategy="single", devices=1, batch_size=8,
                    max_steps=STEPS)
    assert_same_training(result, reference, steps=STEPS, tol=TOL)


def test_fp16_mixed_tp2_runs_near_one_process(tmp_path):
    # fp16 autocast rounds each split matmul's half before tensor parallel sums them, so not bitwise one
    # process. Measured on this machine (2026-11-25): losses within 9.1e-5 (relative), parameters within
    # 3.5e-4 (absolute) after 15 AdamW steps; the bounds leave about 3x of margin. The loss scaler's
    # overflow check is agreed over the ranks (each holds a part of the gradients).
    losses, params = fit(tmp_path / "nd", TokenClassifier(), strategy=NDStrategy(tp=2), devices=2, batch_size=8,
                         max_steps=15, precision="fp16-mixed")
    reference_losses, reference_params = fit(tmp_path / "single", TokenClassifier(), strategy="single", devices=1,
                                             batch_size=8, max_steps=15, precision="fp16-mixed")
    assert len(losses) == len(reference_losses) == 15
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference_losses), rtol=3e-4, atol=0)
    assert params.keys() == reference_params.keys()
    for name in params:
        torch.testing.assert_close(params[name], reference_params[name], rtol=0, atol=1e-3, msg=name)
    assert losses[-1] < 0.8 * losses[0]


@pytest.mark.slow
def test_compile_tp2_equals_one_process(tmp_path):
    # Each block compiled after tensor parallel split it (torchtitan's order): its DTensor matmuls and
    # sequence-parallel norm traced by dynamo. The reference compiles its blocks too.
    result = fit(tmp_path / "nd", TokenClassifier(), strategy=NDStrategy(tp=2), devices=2, batch_size=8,
                 max_steps=STEPS, compile=True)
    reference = fit(tmp_path / "single", TokenClassifier(), strategy="single", devices=1, batch_size=8,
                    max_steps=STEPS, compile=True)
    assert_same_training(result, reference, steps=STEPS, tol=TOL)
