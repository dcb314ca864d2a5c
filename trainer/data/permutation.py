"""A seeded permutation of ``range(n)`` computed per position, in O(1) memory in ``n``.

``IndexPermutation(n, key)[positions]`` gives the sample at each position of the epoch's order
without building the order: a Feistel network over the next power of two >= n is a bijection of
that domain whatever its round function; positions that land outside ``range(n)`` are sent
through it again (cycle-walking) until they land inside, which keeps it a bijection of
``range(n)``. The domain is under 2n, so a position takes fewer than 2 passes on average.
Many positions go through the network at once with int64 tensor ops on the CPU (the plan asks for
the next few global batches' positions in one call: trainer/data/batch_plan.py), the few positions
still walking after that in Python ints: O(batch) per step, the same numbers on every machine
(integer arithmetic only, no floating point, no generator).
"""

from __future__ import annotations

import hashlib

import torch

ROUNDS = 8  # even: the two halves' widths swap every round and are back in place at the end
_MASK32 = (1 << 32) - 1
_TENSOR_WALK_MIN = 64  # fewer walking positions than this go through the network in Python ints


class IndexPermutation:
    """A bijection of ``range(n)`` chosen by ``key``; ``perm[positions]`` maps an int64 tensor of
    positions (each in ``range(n)``) to the indices there.

    Round r's function is multiplicative hashing, ``F(x) = top bits of ((x + add_r) * mul_r mod 2**32)``,
    with ``add_r`` < 2**32 and an odd ``mul_r`` < 2**29 from ``sha256(key, r)``: every product stays
    below 2**63, so int64 never overflows.

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
        self.round_keys = []
        for r in range(ROUNDS):
            digest = hashlib.sha256(f"{key}/round/{r}".encode()).digest()
            add = int.from_bytes(digest[:4], "little")
            mul = (int.from_bytes(digest[4:8], "little") >> 4) | (1 << 28) | 1  # odd, in [2**28, 2**29)
            self.round_keys.append((add, mul))

    def _feistel(self, x: torch.Tensor) -> torch.Tensor:
        """One pass through the network, for a tensor of values: a bijection of ``range(2**bits)``."""
        a, b = self.left_bits, self.right_bits
        left, right = x >> b, x & ((1 << b) - 1)
        for add, mul in self.round_keys:
            # (left: a bits, right: b bits) -> (right: b bits, left ^ F(right): a bits)
            f = (right + add).mul_(mul).bitwise_and_(_MASK32).bitwise_right_shift_(32 - a)
            left, right = right, f.bitwise_xor_(left)
            a, b = b, a
        return left.bitwise_left_shift_(b).bitwise_or_(right)

    def _feistel_int(self, x: int) -> int:
        """``_feistel`` for one Python int (the same numbers)."""
        a, b = self.left_bits, self.right_bits
        left, right = x >> b, x & ((1 << b) - 1)
        for add, mul in self.round_keys:
            left, right = right, left ^ ((((right + add) * mul) & _MASK32) >> (32 - a))
            a, b = b, a
        return (left << b) | right

    def at(self, position: int) -> int:
        """The index at one position (Python ints only)."""
        x = self._feistel_int(position)
        while x >= self.n:
            x = self._feistel_int(x)
        return x

    def __getitem__(self, positions: torch.Tensor) -> torch.Tensor:
        out = self._feistel(positions.to(torch.int64))
        # CPU tensors only; nonzero + numel rather than bool(any()), which a host-sync counter
        # (aten._local_scalar_dense) would count even on the CPU.
        outside = (out >= self.n).nonzero().squeeze(1)
        while outside.numel() >= _TENSOR_WALK_MIN:
            out[outside] = self._feistel(out[outside])
            outside = outside[out[outside] >= self.n]
        if outside.numel():
            walked = []
            for x in out[outside].tolist():
                while x >= self.n:
                    x = self._feistel_int(x)
                walked.append(x)
            out[outside] = torch.tensor(walked, dtype=torch.int64)
        return out

    def range(self, start: int, stop: int) -> torch.Tensor:
        """The indices at positions ``start .. stop-1`` (clipped to ``n``)."""
        return self[torch.arange(start, min(stop, self.n), dtype=torch.int64)]
