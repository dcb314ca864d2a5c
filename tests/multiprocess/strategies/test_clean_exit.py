"""Every strategy's ranks end cleanly: no gloo abort at exit, and no destroyed process group still
referenced as a rank ends (trainer/runtime/distributed.py warns on stderr when one is).

Each run is a process of its own (tests/support/run_fit.py) whose ranks' stderr comes back whole:
ranks spawned straight from a test write to the session's fork server's stderr, which ``capfd``
does not see.
"""

import pytest

from tests.multiprocess.checkpoint.test_checkpoint import LAYOUTS
from tests.support.rank_exit import assert_ranks_ended_cleanly
from tests.support.run_fit import run_fit

pytestmark = pytest.mark.timeout(240)

#: strategy=nd's layouts, on a module of one's own with a tensor-parallel plan (tests/support/nd_modules.py)
ND_LAYOUTS = {
    "nd_tp2": dict(strategy={"name": "nd", "tp": 2}, devices=2, batch_size=8),
    "nd_fsdp2_x_tp2": dict(strategy={"name": "nd", "dp_shard": 2, "tp": 2}, devices=4, batch_size=4),
}


def _assert_clean_fit(tmp_path, spec):
    result = run_fit({"run_dir": str(tmp_path), **spec}, timeout=200)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "step 2/2" in result.stderr, result.stderr[-3000:]  # the ranks' output is here: the check can fail
    assert_ranks_ended_cleanly(result.stderr)


@pytest.mark.parametrize("layout", ["single", "ddp", "zero1", "fsdp", "pipeline"])
def test_ranks_end_cleanly(tmp_path, layout):
    trainer = dict(LAYOUTS[layout], max_steps=2, log_every_n_steps=1, checkpoint=dict(every_n_steps=2))
    _assert_clean_fit(tmp_path, {"module": {"dropout": 0.0}, "trainer": trainer})


@pytest.mark.parametrize("layout", sorted(ND_LAYOUTS))
def test_nd_ranks_end_cleanly(tmp_path, layout):
    # The mesh's groups are held by the module too (its device_mesh, the DTensor parameters, the
    # tensor-parallel hooks): none may outlive the run.
    trainer = dict(ND_LAYOUTS[layout], max_steps=2, log_every_n_steps=1, checkpoint=dict(every_n_steps=2))
    _assert_clean_fit(tmp_path, {"module_class": "tests.support.nd_modules.TokenClassifier", "module": {},
                                 "trainer": trainer})


def test_nd_in_this_process_leaves_no_group_alive(tmp_path):
    # One device: the run is in this process and the caller keeps its module and strategy. The mesh the
    # module was given (its device_mesh) must not keep the destroyed group, and its gloo threads, alive.
    from tests.support.helpers import run_trainer
    from tests.support.nd_modules import TokenClassifier
    from trainer.runtime import distributed
    from trainer.strategies.nd import NDStrategy

    module, strategy, alive = TokenClassifier(), NDStrategy(), distributed.destroyed_groups_alive()
    run_trainer(tmp_path, module, strategy=strategy, devices=1, batch_size=8, max_steps=2)
    assert (tmp_path / "params.pt").is_file()
    assert distributed.destroyed_groups_alive() <= alive
    assert module.device_mesh is None
    # The run's root is kept (a later run in a live group reuses it) without its group: a run after the group
    # ended is told so, as before.
    from trainer.strategies.fsdp import _sharded_root

    with pytest.raises(RuntimeError, match="earlier run whose process group has ended"):
        _sharded_root(module)
