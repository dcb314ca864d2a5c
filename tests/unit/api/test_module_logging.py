"""``self.log`` / ``self.log_dict`` (trainer/loop/log_collector.py): Lightning's names and defaults, values
against a hand computation, one process == 2 DDP ranks, reduce_fx, sync_dist=False, prog_bar,
logger=False, monitors on logged names, refusals, and the hot path with a module that logs every step."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
import torch.nn.functional as F

from tests.support.helpers import PythonCountTokens, Regressor, read_metrics, run_trainer
from trainer import Trainer
from trainer.callbacks import EarlyStopping

pytestmark = pytest.mark.timeout(300)

TOLERANCE = 1e-6  # fp64 sums of fp32 values, reduced in another order on 2 ranks


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


class LoggingRegressor(Regressor):
    """Logs data-only quantities (independent of the weights) with every option; records the first
    feature of every training batch it saw (``<run_dir>/seen_rank{r}.json``) for hand computations."""

    def __init__(self, **kwargs):
        super().__init__(**{"num_samples": 197, "val_samples": 51, **kwargs})  # odd: uneven shares on 2 ranks
        self.seen: list[list[float]] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        q = x[:, 0]
        self.seen.append(q.tolist())  # (a test module may read the host; the trainer does not)
        self.log("q", q.mean())                                  # on_step (training default)
        self.log("q_both", q.mean(), on_step=True, on_epoch=True)  # q_both_step, q_both_epoch
        self.log("q_epoch_only", q.mean(), on_step=False, on_epoch=True)
        self.log_dict({"q_max": q.max(), "q_abs_max": q.abs().max()}, reduce_fx="max")
        self.log("q_lowest", q.min(), reduce_fx="min")
        self.log("count", float(len(q)), reduce_fx="sum")
        self.log("rank_mean", float(_rank()))
        self.log("rank_local", float(_rank()), sync_dist=False)
        self.log("q_bar", q.mean(), prog_bar=True, logger=False)
        return F.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_q", x[:, 0].mean())                      # on_epoch (validation default)
        self.log("val_q_sum", x[:, 0].sum(), reduce_fx="sum")
        return F.mse_loss(self(x), y)

    def on_fit_end(self):
        super().on_fit_end()
        with open(os.path.join(self.trainer.run_dir, f"seen_rank{_rank()}.json"), "w") as f:
            json.dump(self.seen, f)


def _logged(run_dir):
    """(per-step records, epoch-end records, validation records) of metrics.jsonl."""
    records = read_metrics(str(run_dir))
    steps = [r for r in records if "train/loss" in r]
    epochs = [r for r in records if "q_both_epoch" in r]
    validations = [r for r in records if "val_q" in r]
    return steps, epochs, validations


def _fit(run_dir, batch_size=32, **args):
    module = LoggingRegressor()
    trainer = run_trainer(run_dir, module, batch_size=batch_size, max_epochs=1, max_steps=-1, val_every_n_steps=7, **args)
    return module, trainer


def test_names_and_values_match_a_hand_computation(tmp_path):
    # One process, 197 samples, batches of 32: 6 full steps and a short one of 5 (one epoch).
    module, _ = _fit(tmp_path)
    steps, epochs, validations = _logged(tmp_path)
    seen = module.seen
    assert [len(b) for b in seen] == [32] * 6 + [5]
    assert len(steps) == 7 and len(epochs) == 1 and len(validations) == 1
    for record, batch in zip(steps, seen):
        mean = sum(batch) / len(batch)
        assert record["q"] == pytest.approx(mean, abs=TOLERANCE)
        assert record["q_both_step"] == pytest.approx(mean, abs=TOLERANCE)
        assert record["q_max"] == pytest.approx(max(batch), abs=TOLERANCE)
        assert record["q_abs_max"] == pytest.approx(max(abs(v) for v in batch), abs=TOLERANCE)
        assert record["q_lowest"] == pytest.approx(min(batch), abs=TOLERANCE)
        assert record["count"] == len(batch)
        # names as given: no prefix, on_step-only names without a suffix, epoch-only names not per step
        assert "q_both" not in record and "q_epoch_only" not in record and "q_both_epoch" not in record
        assert "q_bar" not in record  # logger=False
    everything = [v for batch in seen for v in batch]
    assert sorted(everything) == pytest.approx(sorted(module.train_dataset().tensors[0][:, 0].tolist()))
    epoch_mean = sum(everything) / len(everything)  # sample-weighted: the short batch counts 5/197
    assert epochs[0]["q_both_epoch"] == pytest.approx(epoch_mean, abs=TOLERANCE)
    assert epochs[0]["q_epoch_only"] == pytest.approx(epoch_mean, abs=TOLERANCE)
    assert epochs[0]["q_both_epoch"] != pytest.approx(sum(sum(b) / len(b) for b in seen) / 7, abs=1e-4)
    val_x = module.val_dataset().tensors[0][:, 0]
    assert validations[0]["val_q"] == pytest.approx(val_x.mean().item(), abs=TOLERANCE)
    assert validations[0]["val_q_sum"] == pytest.approx(val_x.sum().item(), abs=1e-5)


def test_one_process_equals_two_ddp_ranks(tmp_path):
    # 1 process x 32 == 2 ranks x 16; the last global batch has 5 samples, so the ranks' real sample
    # counts differ there (3 and 2): the means stay sample-weighted over the global batch. The validation
    # set (51) splits 26 / 25.
    # Also one process accumulating 2 micro-batches of 16: values logged per micro-batch aggregate
    # over the step's micro-batches.
    _fit(tmp_path / "one")
    _fit(tmp_path / "two", batch_size=16, strategy="ddp", devices=2)
    _fit(tmp_path / "acc", batch_size=16, accumulate_grad_batches=2)
    one, two = _logged(tmp_path / "one"), _logged(tmp_path / "two")
    keys = ["q", "q_both_step", "q_max", "q_abs_max", "q_lowest", "count"]
    for other in (two, _logged(tmp_path / "acc")):
        for records_one, records_two, names in zip(one, other, [keys, ["q_both_epoch", "q_epoch_only"], ["val_q", "val_q_sum"]]):
            assert len(records_one) == len(records_two) > 0
            for a, b in zip(records_one, records_two):
                for name in names:
                    assert b[name] == pytest.approx(a[name], abs=TOLERANCE), name
    # sync_dist=True: the sample-weighted mean of the ranks' numbers; sync_dist=False: rank 0's own.
    seen = [json.load(open(tmp_path / "two" / f"seen_rank{r}.json")) for r in range(2)]
    assert len(seen[0][-1]) != len(seen[1][-1])
    for step, record in enumerate(two[0]):
        counts = [len(seen[r][step]) if step < len(seen[r]) else 0 for r in range(2)]
        assert record["rank_mean"] == pytest.approx(counts[1] / sum(counts), abs=TOLERANCE)
        assert record["rank_local"] == 0.0
    assert [r["rank_mean"] for r in one[0]] == [0.0] * 7


def test_validate_collects_logged_values(tmp_path):
    module = LoggingRegressor()
    metrics = Trainer(run_dir=str(tmp_path), loggers=["jsonl"], progress_bar=False, batch_size=32).validate(module)
    val_x = module.val_dataset().tensors[0][:, 0]
    assert metrics["val_q"] == pytest.approx(val_x.mean().item(), abs=TOLERANCE)
    assert metrics["val_q_sum"] == pytest.approx(val_x.sum().item(), abs=1e-5)


def test_logged_names_reach_monitors_hooks_and_callback_metrics(tmp_path):
    # EarlyStopping and checkpoint.monitor on a self.log'ed validation metric (val_q does not change:
    # data only, so patience=1 stops at the second validation); logger=False names reach the hooks'
    # metrics and trainer.callback_metrics but not the loggers.
    class Watch(LoggingRegressor):
        hook_metrics = []

        def on_train_step_end(self, step, metrics):
            self.hook_metrics.append(metrics)

    module = Watch()
    stopper = EarlyStopping(monitor="val_q", patience=1)
    trainer = Trainer(run_dir=str(tmp_path), loggers=["jsonl"], progress_bar=False, batch_size=32, max_steps=20, log_every_n_steps=1,
                      val_every_n_steps=2, callbacks=[stopper], checkpoint=dict(every_n_steps=2, monitor="val_q", keep_last=None))
    trainer.fit(module)
    assert trainer.global_step == 4
    assert "q_bar" in trainer.callback_metrics and "val_q" in trainer.callback_metrics
    assert "q_bar" not in trainer.logged_metrics and "q" in trainer.logged_metrics  # logger=False: not logged
    assert all("q_bar" in m for m in module.hook_metrics)
    from trainer.checkpoint import layout

    markers = [layout.read_marker(p) for p in layout.committed_checkpoints(str(tmp_path / "checkpoints"))]
    assert [sorted(m["metrics"]) for m in markers] == [["val_q"], ["val_q"]]


def test_prog_bar_names_are_shown(tmp_path, capfd):
    run_trainer(tmp_path, LoggingRegressor(), batch_size=32, max_steps=3, progress_bar=True)
    assert "q_bar=" in capfd.readouterr().err


class LogsWrong(Regressor):
    def __init__(self, where: str, **log_args):
        super().__init__(val_samples=20)
        self.where, self.log_args = where, log_args

    def _log(self, where):
        if where in self.where.split("+"):
            args = dict(self.log_args)
            self.log(args.pop("name", "m"), args.pop("value", 1.0), **args)

    def on_fit_start(self):
        self._log("on_fit_start")

    def training_step(self, batch, batch_idx):
        self._log("training_step")
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self._log("validation_step")
        return super().validation_step(batch, batch_idx)

    def on_validation_end(self, metrics):
        self._log("on_validation_end")


@pytest.mark.parametrize("where, args, error, match", [
    ("training_step", dict(value=torch.ones(2)), ValueError, r"tensor of shape \(2,\)"),
    ("training_step", dict(value="high"), ValueError, "was called with a str"),  # (Lightning's type of error)
    ("training_step", dict(reduce_fx="median"), ValueError, r"\['mean', 'sum', 'max', 'min'\]"),
    ("training_step", dict(on_step=False, on_epoch=False), ValueError, "would log nothing"),
    ("training_step", dict(batch_size=0), ValueError, "batch_size=0"),
    ("training_step", dict(enable_graph=True), ValueError, "enable_graph"),
    ("training_step", dict(metric_attribute="acc"), ValueError, "metric_attribute"),
    ("training_step", dict(sync_dist_group=object()), ValueError, "sync_dist_group"),
    ("training_step", dict(rank_zero_only=True, sync_dist=True), ValueError, "rank_zero_only=True, sync_dist=True"),
    # (the sanity validation pass before step 1 logs it first)
    ("training_step+validation_step", {}, ValueError, r"self.log\('m'\) in the (train|validate) stage, but it is logged in the (validate|train) stage"),
    ("on_fit_start", {}, RuntimeError, r"called from on_fit_start\(\)"),
    ("on_validation_end", {}, RuntimeError, r"called from on_validation_end\(\)"),
])
def test_bad_calls_are_refused_naming_the_value(tmp_path, where, args, error, match):
    with pytest.raises(error, match=match):
        run_trainer(tmp_path, LogsWrong(where, **args), batch_size=32, max_steps=2, val_every_n_steps=1)


def test_log_outside_a_run_and_a_bad_log_dict_are_refused():
    module = Regressor()
    with pytest.raises(RuntimeError, match="outside a run"):
        module.log("m", 1.0)
    with pytest.raises(TypeError, match="mapping"):
        module.log_dict([("m", 1.0)])


def test_rank_zero_only_and_hook_values(tmp_path):
    # rank_zero_only=True: logged unsynced; a value logged in on_before_optimizer_step (a hook: weight 1)
    # and an epoch value logged in on_train_epoch_end.
    class Hooks(Regressor):
        def training_step(self, batch, batch_idx):
            self.log("r0", 2.0, rank_zero_only=True)
            return super().training_step(batch, batch_idx)

        def on_before_optimizer_step(self, optimizer):
            self.log("lr_seen", optimizer.param_groups[0]["lr"])

        def on_train_epoch_end(self, epoch):
            self.log("epoch_hook", float(epoch) + 0.5)

    run_trainer(tmp_path, Hooks(num_samples=64), batch_size=32, max_steps=4)
    records = read_metrics(str(tmp_path))
    steps = [r for r in records if "train/loss" in r]
    assert [r["r0"] for r in steps] == [2.0] * 4
    assert all(math.isclose(r["lr_seen"], 0.05) for r in steps)
    assert [r["epoch_hook"] for r in records if "epoch_hook" in r] == [0.5, 1.5]


def test_quiet_steps_stay_free_of_host_syncs_with_self_log(tmp_path):
    # The hot-path probe of tests/multiprocess/observe/test_hot_path.py with a module that logs on every micro-batch
    # (on_step, on_epoch, max, a Python number): no host sync and only the allowed collectives on
    # the steps that are not logging steps, 1 process and 2 DDP ranks.
    from tests.multiprocess.observe.test_hot_path import QUIET, probe

    for layout_name in ("single", "ddp"):
        ranks, allowed = probe(tmp_path / layout_name, layout_name, LogsEveryStep(), precision="fp32")
        for rank, windows in enumerate(ranks):
            for step in QUIET:
                assert windows[step]["syncs"] == 0, (layout_name, rank, step, windows[step]["where"])
                assert set(windows[step]["collectives"]) <= allowed, (layout_name, rank, step)
        records = read_metrics(str(tmp_path / layout_name))
        assert all("tok_loss_step" in r and "calls" in r for r in records if "train/loss" in r)


class LogsEveryStep(PythonCountTokens):
    """PythonCountTokens with 400 samples (no epoch end within the probe's 8 steps) that logs."""

    def train_dataset(self):
        base = super().train_dataset()
        return torch.utils.data.TensorDataset(*(t.repeat(10, 1) for t in base.tensors))

    def training_step(self, batch, batch_idx):
        out = super().training_step(batch, batch_idx)
        self.log("tok_loss", out["loss"], on_step=True, on_epoch=True)
        self.log("tok_max", out["loss"], reduce_fx="max", on_epoch=True)
        self.log("calls", 1, reduce_fx="sum")
        return out


class PlateauOnLogged(LoggingRegressor):
    """ReduceLROnPlateau monitoring a self.log'ed validation name (``val_q``: constant, never improves)."""

    def __init__(self, monitor: str = "val_q"):
        super().__init__()
        self.monitor = monitor

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": self.monitor}}


def test_reduce_lr_on_plateau_monitors_a_logged_name(tmp_path):
    # Validation after every step: the first sets the best val_q, the second does not improve on it
    # (patience 0), so step 3 runs at half the learning rate. A name nobody logs is an error there.
    run_trainer(tmp_path / "ok", PlateauOnLogged(), batch_size=32, max_steps=3, val_every_n_steps=1)
    assert [r["train/lr"] for r in read_metrics(str(tmp_path / "ok")) if "train/lr" in r] == [0.05, 0.05, 0.025]
    with pytest.raises(ValueError, match=r"'val_qq' is not among the validation metrics, which are .*'val_q'"):
        run_trainer(tmp_path / "bad", PlateauOnLogged("val_qq"), batch_size=32, max_steps=3, val_every_n_steps=1)


class LogsOnOneRank(Regressor):
    """Rank 1 logs a name rank 0 does not (``mode="conflict"``: both log it, with different reduce_fx;
    ``mode="rank0"``: an epoch value with rank_zero_only)."""

    def __init__(self, mode: str = "some"):
        super().__init__(num_samples=64)
        self.mode = mode

    def training_step(self, batch, batch_idx):
        rank = _rank()
        if self.mode == "rank0":
            self.log("r0", 5.0, on_step=False, on_epoch=True, rank_zero_only=True)
        elif self.mode == "conflict":
            self.log("m", 1.0, reduce_fx="max" if rank else "mean")
        elif rank == 1:
            self.log("only_rank1", 3.0, on_epoch=True)
        return super().training_step(batch, batch_idx)


def test_a_name_logged_on_some_ranks_is_reduced_over_them_and_a_conflict_is_an_error(tmp_path):
    # No hang: the names are agreed on logging steps; the mean is over the samples that logged it.
    run_trainer(tmp_path / "some", LogsOnOneRank(), strategy="ddp", devices=2, batch_size=16, max_steps=2)
    records = read_metrics(str(tmp_path / "some"))
    assert [r["only_rank1_step"] for r in records if "train/loss" in r] == [3.0, 3.0]
    assert [r["only_rank1_epoch"] for r in records if "only_rank1_epoch" in r] == [3.0]
    with pytest.raises(Exception, match=r"self.log\('m'\): rank 0 logs it with reduce_fx='mean', rank 1 with "
                                        r"reduce_fx='max'"):
        run_trainer(tmp_path / "conflict", LogsOnOneRank("conflict"), strategy="ddp", devices=2, batch_size=16,
                    max_steps=2)
    # An unsynced value logged by rank 0 alone, reduced at an epoch end before any logging step: rank 0
    # makes no collective the other rank does not (no hang).
    run_trainer(tmp_path / "rank0", LogsOnOneRank("rank0"), strategy="ddp", devices=2, batch_size=16, max_steps=4,
                log_every_n_steps=4, collective_timeout_s=30)
    assert [r["r0"] for r in read_metrics(str(tmp_path / "rank0")) if "r0" in r] == [5.0, 5.0]


def test_fsdp_lockstep_validation_collects_logged_values(tmp_path):
    # FSDP validates in lockstep (short ranks run zero-weight forwards): those count for nothing.
    from trainer.strategies.fsdp import FSDPStrategy

    # 17 validation samples in batches of 8: rank 0 runs 2 batches (9 samples), rank 1 one real batch
    # (8) and one zero-weight forward.
    run_trainer(tmp_path / "one", LoggingRegressor(val_samples=17), batch_size=16, max_steps=2, val_every_n_steps=2)
    run_trainer(tmp_path / "fsdp", LoggingRegressor(val_samples=17), strategy=FSDPStrategy(sharding="full"), devices=2,
                batch_size=8, max_steps=2, val_every_n_steps=2)
    (_, _, [one]), (_, _, [fsdp]) = _logged(tmp_path / "one"), _logged(tmp_path / "fsdp")
    assert fsdp["val_q"] == pytest.approx(one["val_q"], abs=TOLERANCE)
    assert fsdp["val_q_sum"] == pytest.approx(one["val_q_sum"], abs=1e-5)


def test_batch_size_weights_the_epoch_mean(tmp_path):
    # self.log(..., batch_size=n) weighs the value by n, not by the batch's real sample count: logging
    # the constant batch_idx with batch_size = batch_idx + 1 gives sum(i (i+1)) / sum(i + 1) over the epoch.
    class Weighted(Regressor):
        def training_step(self, batch, batch_idx):
            self.log("idx_weighted", float(batch_idx), on_step=False, on_epoch=True, batch_size=batch_idx + 1)
            self.log("idx_plain", float(batch_idx), on_step=False, on_epoch=True)
            x, y = batch
            return F.mse_loss(self(x), y)

    run_trainer(tmp_path, Weighted(num_samples=128), batch_size=32, max_epochs=1, max_steps=-1)
    (record,) = [r for r in read_metrics(str(tmp_path)) if "idx_weighted" in r]  # one epoch end
    indices = range(4)
    weighted = sum(i * (i + 1) for i in indices) / sum(i + 1 for i in indices)
    assert record["idx_weighted"] == pytest.approx(weighted, abs=TOLERANCE)
    assert record["idx_plain"] == pytest.approx(sum(indices) / 4, abs=TOLERANCE)  # equal batches: plain mean
