"""Batch norm whose statistics span every rank of a process group, on any backend (gloo included).

PyTorch's ``nn.SyncBatchNorm`` refuses CPU tensors. ``SyncBatchNorm`` here is a plain-torch
equivalent: in training mode each forward all-reduces the per-channel statistics, and each
backward all-reduces the two per-channel gradient sums the input gradient needs, so a step on
W ranks with local batches b_1..b_W normalises and differentiates exactly like one BatchNorm over
the concatenated batch of b_1 + ... + b_W samples (local batch sizes may differ).

Gradients, and why DDP's averaging makes them right. The trainer backpropagates, on rank r,
``L_r = local mean loss x b_r x W / B`` (B = sum of b_r; with equal b_r this is the local mean),
so ``sum_r L_r = W x L`` where L is the mean loss over the whole batch. The input gradient
``SyncBatchNorm`` returns on rank r is d(sum_r' L_r')/dx_r: the all-reduced sums carry every
rank's loss through the shared mean and variance. That is W x dL/dx_r, and every parameter
gradient upstream (and the local weight/bias gradients of the norm itself, which are plain sums
over the local samples) is each rank's share of d(sum_r L_r)/dtheta. DDP divides the sum over
ranks by W, which gives exactly dL/dtheta: no extra scaling is needed anywhere.

Statistics cover one micro-batch on every rank (``data.batch_size`` x world size samples);
with gradient accumulation each micro-step is normalised on its own, as a single process with
that micro-batch size would. A padding micro-batch (a rank with nothing left in a short last
window loads one real sample with loss weight 0) runs inside ``padding_micro_batch()``: it adds
no samples to the statistics, so they are those of the real samples only, as in one process
(PyTorch's CUDA ``nn.SyncBatchNorm`` too, called on an empty batch by a hook: GPU-only test).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from trainer.runtime.comms_log import SYNC_BN_KIND, labelled

__all__ = ["SyncBatchNorm", "SyncBatchNorm1d", "SyncBatchNorm2d", "SyncBatchNorm3d", "convert_sync_batchnorm",
           "padding_micro_batch"]

_log = logging.getLogger(__name__)
_padding = False  # inside padding_micro_batch()


@contextlib.contextmanager
def padding_micro_batch() -> Iterator[None]:
    """Training forwards inside add nothing to the synchronised statistics (count 0; their output
    is normalised with the other ranks' statistics) and nothing to the backward's gradient sums.
    The loop runs its padding micro-batches (``MicroBatch.num_real == 0``) inside it."""
    global _padding
    previous, _padding = _padding, True
    try:
        yield
    finally:
        _padding = previous


def _group_size(process_group: Any) -> int:
    """Ranks in ``process_group`` (the default group when None); 1 when not distributed."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(process_group)


def _channel_view(tensor: torch.Tensor, dims: int) -> torch.Tensor:
    """A per-channel vector shaped ``(1, C, 1, ...)`` to broadcast against an input of ``dims`` dims."""
    return tensor.view(1, -1, *([1] * (dims - 2)))


class _SyncBatchNormFunction(torch.autograd.Function):
    """y = (x - mean) * invstd * weight + bias with mean/var over all ranks; the backward is the one
    of a single batch norm over the concatenated batch."""

    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, factor, eps, process_group, padding=False):
        channels = input.shape[1]
        reduce_dims = [0, *range(2, input.dim())]
        compute_dtype = torch.promote_types(input.dtype, torch.float32)  # bf16/fp16 inputs: fp32 maths
        x = input.to(compute_dtype)
        local_count = input.numel() // channels if channels and not padding else 0  # padding: no samples

        # Local mean and biased variance by torch's stable reduction, then sums and sums of
        # squares in float64: E[x^2] - E[x]^2 on raw fp32 sums loses digits when |mean| >> std;
        # from accurate local moments in float64 it does not. One all-reduce of [sum, sumsq, count].
        stats = torch.zeros(2 * channels + 1, dtype=torch.float64, device=input.device)
        if local_count > 0:
            local_var, local_mean = torch.var_mean(x, dim=reduce_dims, correction=0)
            local_mean, local_var = local_mean.double(), local_var.double()
            stats[:channels] = local_mean * local_count
            stats[channels:-1] = (local_var + local_mean * local_mean) * local_count
            stats[-1] = local_count
        with labelled(SYNC_BN_KIND):  # for the comms log (not a gradient all-reduce)
            dist.all_reduce(stats, group=process_group)
        count = stats[-1]  # a tensor: the statistics below need no host read of it
        # The global count is at least this rank's: a rank with 2 or more samples knows without
        # reading it (a host sync per layer on a GPU) that it is above 1. Only ranks with 0 or 1 read
        # it; where the global count is <= 1 every rank has <= 1 sample, so all of them read and
        # raise alike.
        if local_count <= 1 and count.item() <= 1:
            raise ValueError(
                f"Expected more than 1 value per channel when training, got {int(count.item())} over all ranks "
                f"(input shape {list(input.shape)} on this rank)"
            )
        mean = stats[:channels] / count
        var = (stats[channels:-1] / count - mean * mean).clamp_min(0)
        invstd = torch.rsqrt(var + eps)

        if running_mean is not None:
            # Like F.batch_norm over the whole batch: the running variance takes the unbiased one.
            running_mean.mul_(1 - factor).add_((mean * factor).to(running_mean.dtype))
            running_var.mul_(1 - factor).add_((var * (count / (count - 1)) * factor).to(running_var.dtype))

        mean, invstd = mean.to(compute_dtype), invstd.to(compute_dtype)
        scale = invstd if weight is None else invstd * weight.to(compute_dtype)
        output = (x - _channel_view(mean, x.dim())) * _channel_view(scale, x.dim())
        if bias is not None:
            output = output + _channel_view(bias.to(compute_dtype), x.dim())

        ctx.save_for_backward(input, weight, mean, invstd)
        ctx.count = count
        ctx.process_group = process_group
        ctx.padding = padding
        ctx.bias_dtype = None if bias is None else bias.dtype
        return output.to(input.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        input, weight, mean, invstd = ctx.saved_tensors
        dims = input.dim()
        reduce_dims = [0, *range(2, dims)]
        channels = input.shape[1]
        compute_dtype = mean.dtype
        grad = grad_output.to(compute_dtype)
        x_hat = (input.to(compute_dtype) - _channel_view(mean, dims)) * _channel_view(invstd, dims)
        sum_grad = grad.sum(dim=reduce_dims)
        sum_grad_x_hat = (grad * x_hat).sum(dim=reduce_dims)

        # Weight and bias gradients are this rank's sums; DDP averages them (see the module docstring).
        grad_weight = sum_grad_x_hat.to(weight.dtype) if weight is not None and ctx.needs_input_grad[1] else None
        grad_bias = sum_grad.to(ctx.bias_dtype) if ctx.bias_dtype is not None and ctx.needs_input_grad[2] else None

        grad_input = None
        if ctx.needs_input_grad[0]:  # the same on every rank, so all of them make this collective
            sums = torch.cat([sum_grad, sum_grad_x_hat])  # a new tensor: the local sums above stay local
            if ctx.padding:  # samples that are not in the batch add nothing (their loss weight is 0 anyway)
                sums.zero_()
            with labelled(SYNC_BN_KIND):
                dist.all_reduce(sums, group=ctx.process_group)
            mean_grad = sums[:channels] / ctx.count
            mean_grad_x_hat = sums[channels:] / ctx.count
            scale = invstd if weight is None else invstd * weight.to(compute_dtype)
            grad_input = (
                (grad - _channel_view(mean_grad, dims) - x_hat * _channel_view(mean_grad_x_hat, dims))
                * _channel_view(scale, dims)
            ).to(input.dtype)
            if ctx.padding:  # not in the batch: nothing depends on these samples
                grad_input = torch.zeros_like(input)
        return grad_input, grad_weight, grad_bias, None, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch norm over the samples of every rank in ``process_group``, for inputs ``(N, C, ...)``.

    In training mode, with a process group of more than one rank, forward normalises with the
    mean and biased variance of the whole batch across ranks and updates the running statistics
    with its unbiased variance (``momentum=None``: cumulative average), exactly as one
    ``BatchNorm`` over the concatenated batch would; backward gives the input the gradient of that
    single batch norm (see the module docstring for the scaling). Every rank must run the same
    number of training forwards and backwards: each one is a collective (one all-reduce of
    ``2C + 1`` float64 values in forward, one of ``2C`` values in backward), with the process
    group's timeout. In eval mode, or alone, it is ``F.batch_norm``: no communication.

    Works on any device and backend (gloo on CPU; ``convert_sync_batchnorm`` picks PyTorch's fused
    ``nn.SyncBatchNorm`` for CUDA modules). The state dict has BatchNorm's keys, so checkpoints
    load into either. It accepts any input of 2 or more dimensions; ``SyncBatchNorm1d/2d/3d``, what
    ``convert_sync_batchnorm`` creates, check dimensions as BatchNorm1d/2d/3d do.
    """

    def __init__(
        self,
        num_features: int,
        eps: float = 1e-5,
        momentum: float | None = 0.1,
        affine: bool = True,
        track_running_stats: bool = True,
        process_group: Any = None,
        device: Any = None,
        dtype: Any = None,
    ):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype)
        self.process_group = process_group

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected an input of 2 or more dimensions (N, C, ...), got {input.dim()}D")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        # Only in training mode, as nn.SyncBatchNorm: evaluation stays local and collective-free
        # (ranks validate different numbers of batches), also when there are no running stats.
        if not self.training or _group_size(self.process_group) == 1:
            return super().forward(input)  # BatchNorm's own forward, momentum bookkeeping included
        if input.shape[1] != self.num_features:
            raise ValueError(f"expected {self.num_features} channels (dim 1), got input of shape {list(input.shape)}")

        # BatchNorm's momentum bookkeeping (momentum=None: cumulative moving average).
        factor = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            # momentum=None: 1 / n as a float64 tensor, not float(n) (a host sync per layer on a GPU)
            factor = 1.0 / self.num_batches_tracked.double() if self.momentum is None else self.momentum
        tracking = self.track_running_stats and self.running_mean is not None
        return _SyncBatchNormFunction.apply(
            input,
            self.weight,
            self.bias,
            self.running_mean if tracking else None,
            self.running_var if tracking else None,
            factor,
            self.eps,
            self.process_group,
            _padding,
        )


class SyncBatchNorm1d(SyncBatchNorm, nn.BatchNorm1d):
    """``SyncBatchNorm`` that is also an ``nn.BatchNorm1d``: code that recognises batch norms with
    ``isinstance`` (a user's ``init_weights``, a no-weight-decay group, conv-BN fusion) still does
    after conversion. Inputs ``(N, C)`` or ``(N, C, L)``."""

    _check_input_dim = nn.BatchNorm1d._check_input_dim


class SyncBatchNorm2d(SyncBatchNorm, nn.BatchNorm2d):
    """``SyncBatchNorm`` that is also an ``nn.BatchNorm2d`` (see ``SyncBatchNorm1d``). Inputs ``(N, C, H, W)``."""

    _check_input_dim = nn.BatchNorm2d._check_input_dim


class SyncBatchNorm3d(SyncBatchNorm, nn.BatchNorm3d):
    """``SyncBatchNorm`` that is also an ``nn.BatchNorm3d`` (see ``SyncBatchNorm1d``). Inputs ``(N, C, D, H, W)``."""

    _check_input_dim = nn.BatchNorm3d._check_input_dim


# What convert_sync_batchnorm replaces (subclasses included, as nn.SyncBatchNorm's conversion does;
# not the lazy variants, whose shapes are unknown) and with what on a non-CUDA device.
REPLACEMENTS = {nn.BatchNorm1d: SyncBatchNorm1d, nn.BatchNorm2d: SyncBatchNorm2d, nn.BatchNorm3d: SyncBatchNorm3d}


def _on_cuda(module: nn.Module) -> bool:
    return any(t.is_cuda for t in itertools.chain(module.parameters(recurse=False), module.buffers(recurse=False)))


def _padding_to_empty(module: nn.Module, args: tuple) -> tuple | None:
    """Forward pre-hook of PyTorch's ``nn.SyncBatchNorm``: inside ``padding_micro_batch()`` it is
    called on no samples (it then adds count 0 to the statistics and still makes its collectives)."""
    if not (_padding and module.training):
        return None
    module.__dict__["_padding_input"] = args[0]
    return (args[0][:0], *args[1:])


def _padding_output(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor | None:
    """Forward hook paired with ``_padding_to_empty``: zeros of the padding input's shape (its loss
    weight is 0 and nothing depends on it), tied to the empty call so that its backward collective runs."""
    padding_input = module.__dict__.pop("_padding_input", None)
    if padding_input is None:
        return None
    return torch.zeros_like(padding_input) + output.sum() * 0


def _convert_one(bn: _BatchNorm, process_group: Any) -> nn.Module:
    """The synchronised replacement of one batch norm, sharing its parameters and buffers."""
    if _on_cuda(bn):
        cls = nn.SyncBatchNorm  # (padding micro-batches: the hooks below; it accepts empty local batches)
    else:
        cls = next(sync for base, sync in REPLACEMENTS.items() if isinstance(bn, base))
    converted = cls(bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats, process_group)
    if bn.affine:
        # The same Parameter objects: requires_grad, an optimizer built before, and ties survive.
        converted.weight = bn.weight
        converted.bias = bn.bias
    converted.running_mean = bn.running_mean
    converted.running_var = bn.running_var
    converted.num_batches_tracked = bn.num_batches_tracked
    converted.train(bn.training)
    if hasattr(bn, "qconfig"):
        converted.qconfig = bn.qconfig
    if cls is nn.SyncBatchNorm:
        converted.register_forward_pre_hook(_padding_to_empty)
        converted.register_forward_hook(_padding_output)
    return converted


def convert_sync_batchnorm(module: nn.Module, process_group: Any = None) -> nn.Module:
    """Replace every ``nn.BatchNorm1d/2d/3d`` in ``module`` (``module`` itself included) by a batch
    norm synchronised over ``process_group`` (None: the default group), and return the result.

    Each replacement keeps the original's weight and bias (the same Parameter objects), running
    statistics, ``num_batches_tracked``, momentum, eps, ``affine``, ``track_running_stats`` and
    train/eval mode. A batch norm whose tensors live on a CUDA device becomes PyTorch's fused
    ``nn.SyncBatchNorm`` (NCCL; not exercised by the CPU tests); any other (CPU, or a meta-device
    build) becomes this module's ``SyncBatchNorm1d/2d/3d``, which works on gloo and is still an
    instance of the class it replaced (a meta build later materialised on a GPU keeps ours: correct
    on NCCL too, only slower than the fused kernels). Converting twice changes nothing.

    Call it after the model is built and before a data-parallel wrapper (DDP, FSDP) wraps it.
    ``process_group`` must hold exactly the ranks that see different samples of the same layer:
    the default group for DDP and FSDP, the data-parallel sub-group when ranks also split the
    model (pipeline stages). Converting without a process group is harmless: alone,
    ``SyncBatchNorm`` is plain batch norm.
    """
    if isinstance(module, SyncBatchNorm):  # ours are BatchNorm subclasses too: already converted
        return module
    if isinstance(module, tuple(REPLACEMENTS)):
        return _convert_one(module, process_group)
    for name, child in module.named_children():
        converted = convert_sync_batchnorm(child, process_group)
        if converted is not child:
            module.add_module(name, converted)  # replaces the entry in place: child order is kept
    return module


def warn_if_nothing_to_sync(module: nn.Module, data_parallel_size: int) -> None:
    """``trainer.sync_batchnorm=true`` that cannot change anything is said once, not silently kept."""
    from trainer.runtime.rank_logging import rank_zero_warn

    if not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules()):
        rank_zero_warn(_log, "trainer.sync_batchnorm=true: %s has no BatchNorm1d/2d/3d layer, so there is nothing "
                       "to synchronise; unset it", type(module).__name__)
    elif data_parallel_size == 1:
        rank_zero_warn(_log, "trainer.sync_batchnorm=true with one data-parallel rank: batch norm statistics are "
                       "this rank's micro-batch's either way; it matters with strategy=ddp/fsdp on several devices")
