"""fp16 dynamic loss scaling (trainer/precision/loss_scaler.py): DeepSpeed's rules, exactness, resume.

Every expected value below is derived from the rules (start at 2**initial_scale_power, halve after
``hysteresis`` overflows, never below ``min_loss_scale``, double after ``loss_scale_window`` clean
steps), not copied from a run of the code.
"""

import threading

import pytest
import torch

from trainer.precision.loss_scaler import DynamicLossScaler

INF, NAN = float("inf"), float("nan")


def make_grads(scaler: DynamicLossScaler, bad: float | None = None) -> list[torch.Tensor]:
    """Gradients as backward of a scaled loss would leave them; ``bad`` lands in one element."""
    grads = [torch.full((4,), 3.0 * scaler.loss_scale), torch.full((3,), 0.5 * scaler.loss_scale)]
    if bad is not None:
        grads[1][2] = bad
    return grads


def run_step(scaler: DynamicLossScaler, overflow: bool, all_reduce_max=None) -> bool:
    """One step of the trainer's protocol; returns whether the optimizer would step."""
    ok = scaler.unscale_(make_grads(scaler, INF if overflow else None), all_reduce_max)
    scaler.update(found_inf=not ok)
    return ok


def other_rank_says(flag: float):
    """A fake MAX all-reduce over this rank and one other rank whose local flag is ``flag``."""

    def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
        assert tensor.shape == (1,) and tensor.dtype == torch.float32
        return torch.maximum(tensor, torch.tensor([flag], dtype=torch.float32))

    return all_reduce_max


def dynamic_state(scaler: DynamicLossScaler) -> tuple:
    return (scaler.loss_scale, scaler.growth_tracker, scaler.cur_hysteresis, scaler.skipped_steps,
            scaler.overflows, scaler.consecutive_overflows)


# ----- overflow: skip, hysteresis, halving, floor ---------------------------------------------------
@pytest.mark.parametrize("bad", [INF, -INF, NAN])
def test_overflow_is_skipped_and_counted_scale_kept_while_hysteresis_lasts(bad):
    hysteresis, power = 3, 10
    scaler = DynamicLossScaler(initial_scale_power=power, loss_scale_window=1000, hysteresis=hysteresis)
    start = 2.0**power
    for overflow in range(1, hysteresis):
        assert scaler.unscale_(make_grads(scaler, bad)) is False
        scaler.update(found_inf=True)
        assert scaler.skipped_steps == overflow and scaler.overflows == overflow
        assert scaler.scale == start, "the hysteresis budget absorbs the first overflows"
        assert scaler.cur_hysteresis == hysteresis - overflow
    assert scaler.unscale_(make_grads(scaler, bad)) is False
    scaler.update(found_inf=True)
    assert scaler.scale == start / 2, "the hysteresis-th overflow halves the scale"
    assert scaler.skipped_steps == hysteresis


def test_scale_halves_per_overflow_once_hysteresis_is_spent_and_never_below_min():
    power, minimum, hysteresis = 5, 3.0, 2  # 32 -> 16 -> 8 -> 4 -> max(2, 3) = 3 -> 3 ...
    scaler = DynamicLossScaler(initial_scale_power=power, loss_scale_window=1000, hysteresis=hysteresis,
                               min_loss_scale=minimum)
    expected = 2.0**power
    for step in range(1, 12):
        assert run_step(scaler, overflow=True) is False
        if step >= hysteresis:
            expected = max(expected / 2, minimum)
        assert scaler.scale == expected
        assert scaler.scale >= minimum
    assert scaler.scale == minimum
    assert scaler.skipped_steps == scaler.overflows == scaler.consecutive_overflows == 11
    assert run_step(scaler, overflow=False) is True
    assert scaler.consecutive_overflows == 0 and scaler.skipped_steps == 11


def test_skipped_step_leaves_the_parameters_and_a_clean_step_applies_the_true_gradient():
    power, lr = 12, 0.5
    scaler = DynamicLossScaler(initial_scale_power=power, hysteresis=1, min_loss_scale=1.0)
    w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.25]))
    x = torch.tensor([3.0, 0.5, -8.0])  # d(w.x)/dw = x, exact
    optimizer = torch.optim.SGD([w], lr=lr)
    for inject in (True, False):
        before = w.detach().clone()
        scale_before = scaler.loss_scale
        scaler.scale_loss((w * x).sum()).backward()
        assert torch.equal(w.grad, x * scale_before)
        if inject:
            w.grad[0] = INF
        ok = scaler.unscale_([w.grad], other_rank_says(0.0))
        if ok:
            assert torch.equal(w.grad, x)
            optimizer.step()
        scaler.update(found_inf=not ok)
        optimizer.zero_grad(set_to_none=True)
        if inject:
            assert not ok and torch.equal(w.detach(), before)
            assert scaler.scale == scale_before / 2  # hysteresis=1: every overflow halves
        else:
            assert ok and torch.equal(w.detach(), before - lr * x)


# ----- growth ----------------------------------------------------------------------------------------
def test_scale_doubles_after_exactly_loss_scale_window_clean_steps():
    window, power = 5, 8
    scaler = DynamicLossScaler(initial_scale_power=power, loss_scale_window=window, hysteresis=2)
    expected = 2.0**power
    for _ in range(2):  # two windows in a row: the count restarts after a raise
        for clean in range(1, window):
            assert run_step(scaler, overflow=False) is True
            assert scaler.scale == expected, f"no growth after {clean} < {window} clean steps"
            assert scaler.growth_tracker == clean
        run_step(scaler, overflow=False)
        expected *= 2
        assert scaler.scale == expected and scaler.growth_tracker == 0


def test_an_overflow_restarts_the_clean_step_count():
    window, power = 5, 8
    scaler = DynamicLossScaler(initial_scale_power=power, loss_scale_window=window, hysteresis=2)
    for _ in range(window - 1):
        run_step(scaler, overflow=False)
    run_step(scaler, overflow=True)  # absorbed by the hysteresis budget: scale unchanged
    assert scaler.scale == 2.0**power and scaler.growth_tracker == 0 and scaler.cur_hysteresis == 1
    for _ in range(window - 1):
        run_step(scaler, overflow=False)
        assert scaler.scale == 2.0**power
    run_step(scaler, overflow=False)
    assert scaler.scale == 2.0 ** (power + 1)
    assert scaler.cur_hysteresis == 2, "a raise refills the hysteresis budget"


# ----- consecutive_hysteresis ------------------------------------------------------------------------
@pytest.mark.parametrize("consecutive", [False, True])
def test_consecutive_hysteresis(consecutive):
    power, hysteresis = 10, 2
    scaler = DynamicLossScaler(initial_scale_power=power, loss_scale_window=100, hysteresis=hysteresis,
                               consecutive_hysteresis=consecutive)
    for overflow in (True, False, True):  # overflow, clean, overflow: never two in a row
        run_step(scaler, overflow)
    if consecutive:  # the clean step refilled the budget: the second overflow is absorbed too
        assert scaler.scale == 2.0**power and scaler.cur_hysteresis == hysteresis - 1
    else:  # budget spent by the first overflow and not refilled: the second one halves
        assert scaler.scale == 2.0 ** (power - 1) and scaler.cur_hysteresis == 1
    run_step(scaler, True)  # two in a row halve in both modes
    assert scaler.scale == 2.0 ** (power - 1 if consecutive else power - 2)


# ----- unscale_ ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,power", [(torch.float32, 16), (torch.float32, 100), (torch.float16, 10),
                                         (torch.float16, 30), (torch.bfloat16, 30), (torch.float64, 60)])
def test_unscale_divides_exactly_by_the_scale(dtype, power):
    scaler = DynamicLossScaler(initial_scale_power=power)
    scale = 2.0**power
    generator = torch.Generator().manual_seed(power)
    high = 60000.0 if dtype == torch.float16 else 1e30
    scaled = [(torch.randn(64, generator=generator, dtype=torch.float64) * 1000).to(dtype),
              torch.tensor([high, 2.0**15, -(2.0**-10), 0.0], dtype=torch.float64).to(dtype),
              torch.randn(6, 5, generator=generator, dtype=torch.float64).to(dtype)[:, ::2],  # not contiguous
              torch.zeros(0, dtype=dtype)]
    # The exact quotient rounded once into dtype (float64 holds every quotient here exactly).
    expected = [(t.double() / scale).to(dtype) for t in scaled]
    assert any(bool(e.ne(0).any()) for e in expected)
    grads = [t.clone() for t in scaled[:2]] + [scaled[2]] + [scaled[3]]
    assert scaler.unscale_(grads) is True
    for got, want in zip(grads, expected):
        assert got.dtype == dtype and torch.equal(got, want)


def test_unscale_handles_mixed_dtypes_none_and_empty_lists():
    scaler = DynamicLossScaler(initial_scale_power=4)
    grads = [torch.full((3,), 32.0), None, torch.full((2,), 48.0, dtype=torch.float16), torch.zeros(0)]
    assert scaler.unscale_(grads) is True
    assert torch.equal(grads[0], torch.full((3,), 2.0))
    assert torch.equal(grads[2], torch.full((2,), 3.0, dtype=torch.float16))

    calls = []

    def recording(tensor):
        calls.append(tensor.clone())
        return tensor

    assert scaler.unscale_([], recording) is True
    assert len(calls) == 1 and calls[0].shape == (1,) and calls[0].dtype == torch.float32 and calls[0].item() == 0
    # A rank without gradients still joins the all-reduce, and follows the others' decision.
    assert scaler.unscale_([], other_rank_says(1.0)) is False


def test_unscale_reads_exactly_one_value_to_the_host(monkeypatch):
    scaler = DynamicLossScaler(initial_scale_power=30)
    grads = [torch.ones(3), torch.ones(4, dtype=torch.float16), torch.ones(2, dtype=torch.bfloat16)]
    reads = []
    with monkeypatch.context() as patch:
        for name in ("item", "tolist", "__bool__", "__float__", "__int__"):
            original = getattr(torch.Tensor, name)

            def counting(self, *args, _original=original, _name=name, **kwargs):
                reads.append(_name)
                return _original(self, *args, **kwargs)

            patch.setattr(torch.Tensor, name, counting)
        scaler.unscale_(grads, other_rank_says(0.0))
    assert reads == ["item"]


# ----- every rank takes the same decision ------------------------------------------------------------
def test_a_non_finite_gradient_on_another_rank_makes_this_rank_skip():
    scaler = DynamicLossScaler(initial_scale_power=8)
    assert scaler.unscale_(make_grads(scaler), other_rank_says(1.0)) is False
    scaler.update(found_inf=True)
    assert scaler.skipped_steps == 1
    assert scaler.unscale_(make_grads(scaler), other_rank_says(0.0)) is True


def test_all_reduce_in_place_returning_none_and_a_nan_result_count():
    scaler = DynamicLossScaler(initial_scale_power=8)

    def in_place_overflow(tensor):  # torch.distributed.all_reduce style: works in place, returns None
        tensor.fill_(1.0)

    assert scaler.unscale_(make_grads(scaler), in_place_overflow) is False
    # A broken reduction (nan) must not pass for "all finite".
    assert scaler.unscale_(make_grads(scaler), lambda tensor: torch.full_like(tensor, NAN)) is False


class FakeGroup:
    """A MAX all-reduce over ``world_size`` threads standing in for ranks."""

    def __init__(self, world_size: int):
        self.barrier = threading.Barrier(world_size, timeout=30)
        self.slots: list = [None] * world_size
        self.local_flags: list = [None] * world_size

    def all_reduce_max(self, rank: int):
        def reduce(tensor: torch.Tensor) -> torch.Tensor:
            assert tensor.shape == (1,) and tensor.dtype == torch.float32
            self.local_flags[rank] = tensor.item()
            self.slots[rank] = tensor.clone()
            self.barrier.wait()
            result = torch.stack(self.slots).amax(dim=0)
            self.barrier.wait()
            return tensor.copy_(result)  # in place, as torch.distributed.all_reduce

        return reduce


@pytest.mark.parametrize("bad", [INF, NAN])
def test_every_rank_skips_when_one_rank_overflows(bad):
    world_size, hysteresis = 3, 1
    group = FakeGroup(world_size)
    scalers = [DynamicLossScaler(initial_scale_power=10, hysteresis=hysteresis) for _ in range(world_size)]
    results, errors = [None] * world_size, []

    def rank_main(rank: int):
        try:
            scaler = scalers[rank]
            grads = make_grads(scaler, bad if rank == 1 else None)  # only rank 1 sees the overflow
            results[rank] = scaler.unscale_(grads, group.all_reduce_max(rank))
            scaler.update(found_inf=not results[rank])
        except BaseException as error:  # surfaced in the main thread
            errors.append(error)

    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert group.local_flags == [0.0, 1.0, 0.0]
    assert results == [False] * world_size
    assert all(s.state_dict() == scalers[0].state_dict() for s in scalers)
    assert scalers[0].skipped_steps == 1 and scalers[0].scale == 2.0**9  # hysteresis=1: halved everywhere


# ----- scale(loss) / the scale value --------------------------------------------------------------------
def test_scale_loss_multiplies_the_loss_and_scale_is_the_current_value():
    power = 12
    scaler = DynamicLossScaler(initial_scale_power=power)
    w = torch.tensor([1.5, -2.0], requires_grad=True)
    x = torch.tensor([3.0, 0.25])
    loss = (w * x).sum()
    scaled = scaler.scale_loss(loss)
    assert scaled.item() == loss.item() * 2**power
    scaled.backward()
    assert torch.equal(w.grad, x * 2**power)
    # The trainer also logs it as a number.
    assert isinstance(scaler.scale, float) and float(scaler.scale) == 2.0**power == scaler.loss_scale
    assert "%g" % scaler.scale == "%g" % 2.0**power
    # An fp16 loss is scaled in float32: 8 * 2**16 is beyond fp16's 65504.
    scaler16 = DynamicLossScaler(initial_scale_power=16)
    scaled16 = scaler16.scale_loss(torch.tensor(8.0, dtype=torch.float16))
    assert scaled16.dtype == torch.float32 and scaled16.item() == 8.0 * 2**16


# ----- static scale ------------------------------------------------------------------------------------
def test_static_scale_never_changes_but_overflows_are_skipped_and_counted():
    static = 128.0
    scaler = DynamicLossScaler(static_loss_scale=static, loss_scale_window=2, hysteresis=1, min_loss_scale=1.0)
    assert not scaler.dynamic
    pattern = [False] * 5 + [True] * 4 + [False] * 5 + [True]
    for overflow in pattern:
        assert run_step(scaler, overflow) is (not overflow)
        assert scaler.scale == static
    assert scaler.skipped_steps == scaler.overflows == sum(pattern)
    grads = [torch.full((2,), 3.0 * static)]
    assert scaler.unscale_(grads) and torch.equal(grads[0], torch.full((2,), 3.0))
