"""A seeded permutation of ``range(n)`` computed per position, in O(1) memory in ``n``.

``IndexPermutation(n, key)[positions]`` gives the sample at each position of the epoch's order
without building the order: a Feistel network over the next power of two >= n is a bijection of
that domain whatever its round function; positions that land outside ``range(n)`` are sent
through it again (cycle-walking) until they land inside, which keeps it a bijection of
``range(n)``. The domain is under 2n, so a position takes fewer than 2 passes on average.
A whole global batch is computed at once with int64 tensor ops on the CPU: O(batch) per step,
the same numbers on every machine (integer arithmetic only, no floating point, no generator).
"""

from __future__ import annotations

import hashlib

import torch

ROUNDS = 8  # even: the two halves' widths swap every round and are back in place at the end
_MASK32 = (1 << 32) - 1


def _round_keys(key: int) -> list[int]:
    return [int.from_bytes(hashlib.sha256(f"{key}/round/{r}".encode()).digest()[:4], "little") for r in range(ROUNDS)]


def _mix(x: torch.Tensor, round_key: int) -> torch.Tensor:
    """A 32-bit hash of ``x`` (< 2**32) keyed by ``round_key``: every product stays below 2**60,
    so int64 never overflows."""
    x = (x ^ round_key) & _MASK32
    x = (x * 0x45D9F3B) & _MASK32
    x = x ^ (x >> 16)
    x = ((x + round_key) * 0x45D9F3B) & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x119DE1F3) & _MASK32
    return x ^ (x >> 15)


class IndexPermutation:
    """A bijection of ``range(n)`` chosen by ``key``; ``perm[positions]`` maps an int64 tensor of
    positions (each in ``range(n)``) to the indices there.

    Args:
        n: the size of the permuted range (>= 1; at most 2**62).
        key: which permutation (any int; the trainer passes ``derive_seed(seed, "epoch", e)``).
    """

    def __init__(self, n: int, key: int):
        if not 1 <= n <= 1 << 62:
            raise ValueError(f"a permutation needs 1 <= n <= 2**62, got {n}")
        self.n = n
        bits = max(2, (n - 1).bit_length())  # the domain 2**bits is the next power of two >= n (at least 4)
        self.left_bits, self.right_bits = (bits + 1) // 2, bits // 2
        self.round_keys = _round_keys(key)

    def _feistel(self, x: torch.Tensor) -> torch.Tensor:
        """One pass through the network: a bijection of ``range(2**bits)``."""
        a, b = self.left_bits, self.right_bits
        left, right = x >> b, x & ((1 << b) - 1)
        for round_key in self.round_keys:
            # (left: a bits, right: b bits) -> (right: b bits, left ^ F(right): a bits)
            left, right = right, left ^ (_mix(right, round_key) & ((1 << a) - 1))
            a, b = b, a
        return (left << b) | right

    def __getitem__(self, positions: torch.Tensor) -> torch.Tensor:
        out = self._feistel(positions.to(torch.int64))
        # CPU tensors only; nonzero + numel rather than bool(any()), which a host-sync counter
        # (aten._local_scalar_dense) would count even on the CPU.
        outside = (out >= self.n).nonzero().squeeze(1)
        while outside.numel():
            out[outside] = self._feistel(out[outside])
            outside = outside[out[outside] >= self.n]
        return out

    def range(self, start: int, stop: int) -> torch.Tensor:
        """The indices at positions ``start .. stop-1`` (clipped to ``n``)."""
        return self[torch.arange(start, min(stop, self.n), dtype=torch.int64)]
