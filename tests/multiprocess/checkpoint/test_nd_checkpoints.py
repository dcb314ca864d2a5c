"""Checkpoints of strategy=nd (tensor parallel over ``tp``, FSDP over ``dp_shard``; DTensor parameters and
optimizer state) across mesh shapes: a sharded save of FSDP 2 x TP 2 resumes bitwise on the same layout
(after a rank is killed too), loads in one process, continues on 2 x 2 -> 4 x 1, -> HSDP 2 x TP 2,
-> strategy=fsdp and -> one process, strategy=fsdp -> 2 x 2, and TP 2 -> one process; the full format
and ``consolidate`` give the same weights.

The module is strategy=nd's own test module (tests/support/nd_modules.py: a plan with column- and
row-wise splits, sequence-parallel norms and loss parallel, AdamW). Same layout: bitwise (the same
reductions in the same order, generators restored). Another layout sums the row-split products and the
gradient shards in another order: those continuations are compared with ``TOL`` (the issue's bar; the
module has no dropout, so nothing there depends on the per-rank random streams).
"""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from tests.support.helpers import REPO, fit, new_trainer
from tests.support.nd_modules import TokenClassifier
from tests.support.run_fit import run_fit
from tests.multiprocess.checkpoint.test_checkpoint import per_step_losses
from trainer.checkpoint import consolidate, layout
from trainer.strategies import resolve_strategy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
STEPS = 15  # 12 steps per epoch (96 samples, global batch 8): the resumes cross an epoch boundary
EVERY = 3
RESUME_AT = 6
KILL_AT = 8  # a rank dies after step 8: the last checkpoint is step 6
TOL = dict(rtol=1e-5, atol=1e-6)
KILLED = "tests.support.tp_modules.KilledTokenClassifier"

#: (strategy options, processes, per-rank batch): every layout trains on the same global batch of 8
LAYOUTS = {
    "2x2": ({"name": "nd", "dp_shard": 2, "tp": 2}, 4, 4),
    "4x1": ({"name": "nd", "dp_shard": 4, "tp": 1}, 4, 2),
    "hsdp2x2": ({"name": "nd", "dp_replicate": 2, "dp_shard": 1, "tp": 2}, 4, 4),
    "tp2": ({"name": "nd", "dp_shard": 1, "tp": 2}, 2, 8),
    "fsdp": ("fsdp", 2, 4),
    "single": ("single", 1, 8),
}


def layout_args(name, as_json=False):
    """Trainer arguments of LAYOUTS[name] (the strategy as an object, or as run_fit.py's JSON)."""
    strategy, devices, batch_size = LAYOUTS[name]
    if isinstance(strategy, dict) and not as_json:
        options = dict(strategy)
        strategy = resolve_strategy(options.pop("name"), **options)
    return dict(strategy=strategy, devices=devices, batch_size=batch_size)


def run(path, name, module=None, **options):
    args = dict(layout_args(name), max_steps=STEPS, checkpoint=dict(every_n_steps=EVERY, keep_last=None))
    args.update(options)
    return fit(path, module or TokenClassifier(), **args)


def step_dir(run_dir, step):
    return os.path.join(str(run_dir), "checkpoints", layout.checkpoint_name(step))


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The uninterrupted FSDP 2 x TP 2 run, a sharded checkpoint every 3 steps (written in the
    background: DCP stages the DTensor shards): (losses, final parameters, run directory)."""
    run_dir = tmp_path_factory.mktemp("nd") / "whole"
    losses, params = run(run_dir, "2x2", checkpoint=dict(every_n_steps=EVERY, keep_last=None, async_save=True))
    assert len(losses) == STEPS
    return losses, params, run_dir


def test_killed_rank_resumes_bitwise_on_the_same_layout(tmp_path, whole):
    reference_losses, reference_params, _ = whole
    run_dir = tmp_path / "killed"
    trainer = dict(layout_args("2x2", as_json=True), max_steps=STEPS, checkpoint=dict(every_n_steps=EVERY))
    killed = run_fit({"run_dir": str(run_dir), "module_class": KILLED, "module": {"kill_at_step": KILL_AT, "kill_rank": 1},
                      "trainer": trainer}, timeout=300)
    assert killed.returncode != 0
    assert max(per_step_losses(run_dir)) == KILL_AT  # it really died at step 8 ...
    assert layout.find_latest(str(run_dir / "checkpoints")) == step_dir(run_dir, RESUME_AT)  # ... after saving step 6
    _, params = fit(run_dir, TokenClassifier(), resume="auto", **dict(trainer, **layout_args("2x2")))
    losses = per_step_losses(run_dir)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert [losses[s] for s in range(1, STEPS + 1)] == reference_losses  # bitwise
    assert params.keys() == reference_params.keys()
    for name, value in reference_params.items():
        assert torch.equal(params[name], value), name


@pytest.mark.parametrize("target", ["4x1", "hsdp2x2", "fsdp", "single"])
def test_sharded_checkpoint_continues_on_other_layouts(tmp_path, whole, target):
    reference_losses, reference_params, run_dir = whole
    losses, params = run(tmp_path, target, resume=step_dir(run_dir, RESUME_AT), checkpoint=None)
    # The same global batches continue: steps 7..15 match the uninterrupted run (AdamW's moments too:
    # fresh ones would make the first step after the resume move every weight by a whole learning rate).
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference_losses[RESUME_AT:]), **TOL)
    assert params.keys() == reference_params.keys()
    for name, value in reference_params.items():
        torch.testing.assert_close(params[name], value, **TOL, msg=name)


def test_fsdp_checkpoint_continues_on_fsdp_x_tensor_parallel(tmp_path, whole):
    # A run started under strategy=fsdp (1-D shards) goes on split over 2 x 2 (2-D DTensors).
    reference_losses, reference_params, _ = whole
    run(tmp_path / "fsdp", "fsdp", max_steps=RESUME_AT)
    losses, params = run(tmp_path / "nd", "2x2", resume=step_dir(tmp_path / "fsdp", RESUME_AT), checkpoint=None)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference_losses[RESUME_AT:]), **TOL)
    for name, value in reference_params.items():
        torch.testing.assert_close(params[name], value, **TOL, msg=name)


def test_tensor_parallel_checkpoint_continues_in_one_process(tmp_path, whole):
    reference_losses, reference_params, _ = whole
    saved, _ = run(tmp_path / "tp2", "tp2", max_steps=RESUME_AT)
    torch.testing.assert_close(torch.tensor(saved), torch.tensor(reference_losses[:RESUME_AT]), **TOL)
    losses, params = run(tmp_path / "one", "single", resume=step_dir(tmp_path / "tp2", RESUME_AT), checkpoint=None)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference_losses[RESUME_AT:]), **TOL)
    for name, value in reference_params.items():
        torch.testing.assert_close(params[name], value, **TOL, msg=name)


def _val_loss(module):
    """The loss over the module's whole validation set, in this process."""
    x, y = module.val_dataset().tensors
    with torch.no_grad():
        return F.cross_entropy(module.eval()(x).flatten(0, 1), y.flatten()).item()


def test_sharded_checkpoint_loads_in_one_process(tmp_path, whole):
    _, reference_params, run_dir = whole
    final = step_dir(run_dir, STEPS)
    # load_from_checkpoint: the whole weights, exactly those the run ended with.
    loaded = TokenClassifier.load_from_checkpoint(final)
    state = loaded.state_dict()
    assert state.keys() == reference_params.keys()
    for name, value in reference_params.items():
        assert torch.equal(state[name], value), name
    reference = TokenClassifier(val_samples=40)
    reference.configure_model()
    reference.load_state_dict(reference_params)
    expected = _val_loss(reference)
    # Trainer(strategy=single): validate the checkpoint (ckpt_path), and start from its consolidated
    # weights (trainer.init_from).
    weights = tmp_path / "weights.pt"
    consolidate(final, str(weights))
    results = {
        "ckpt_path": new_trainer(tmp_path / "a", **layout_args("single")).validate(TokenClassifier(val_samples=40),
                                                                                  ckpt_path=final),
        "init_from": new_trainer(tmp_path / "b", **layout_args("single"), init_from=str(weights)).validate(
            TokenClassifier(val_samples=40)),
    }
    for how, result in results.items():
        assert result["val/loss"] == pytest.approx(expected, rel=1e-5), how


def test_full_format_and_consolidate_give_the_sharded_weights(tmp_path, whole):
    reference_losses, reference_params, run_dir = whole
    module = TokenClassifier()
    losses, _ = run(tmp_path / "full", "2x2", module=module, max_steps=RESUME_AT,
                    checkpoint=dict(every_n_steps=EVERY, keep_last=None, format="full"))
    assert losses == reference_losses[:RESUME_AT]
    full = torch.load(os.path.join(step_dir(tmp_path / "full", RESUME_AT), "model_optim.pt"), weights_only=True)
    # consolidate (python -m trainer.checkpoint consolidate) of the sharded step-6 checkpoint: the same tensors.
    out = tmp_path / "consolidated.pt"
    result = subprocess.run([sys.executable, "-m", "trainer.checkpoint", "consolidate", step_dir(run_dir, RESUME_AT),
                             str(out)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    consolidated = torch.load(out, weights_only=True)
    assert consolidated.keys() == full["model"].keys()
    for name, value in full["model"].items():
        assert not hasattr(value, "placements"), name  # whole tensors, not DTensors
        assert torch.equal(consolidated[name], value), name
    # The weights fit returned to the caller's module (spawned workers): the full checkpoint's.
    returned = module.state_dict()
    for name, value in full["model"].items():
        assert torch.equal(returned[name], value), name
    # The full checkpoint resumes bitwise on the same layout (rank 0 reads it, every rank gets its shards).
    _, params = run(tmp_path / "full", "2x2", resume="auto", checkpoint=dict(format="full", every_n_steps=EVERY))
    losses = per_step_losses(tmp_path / "full")
    assert [losses[s] for s in range(1, STEPS + 1)] == reference_losses
    for name, value in reference_params.items():
        assert torch.equal(params[name], value), name
