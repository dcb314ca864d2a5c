"""The CPU generators of torch, ``random`` and NumPy seeded for loading one batch in the main process,
then put back: loading never draws from (or shifts) the training's own streams (dropout, a
``training_step``'s draws), and draws what a worker seeded the same way draws. CUDA's stays untouched.

This runs once per batch, so its cost is a per-step cost. NumPy's own ``get_state()`` / ``set_state()``
copy the 624-word state of its global generator word by word (~25 µs each, more than the rest of a
step's bookkeeping together); ``_NumpyState`` copies it as bytes instead.
"""

from __future__ import annotations

import ctypes
import random
import sys
from typing import Any

import torch

_MT19937_BYTES = 624 * 4 + 4  # numpy's mt19937_state: uint32_t key[624]; int pos


class _NumpyState:
    """Saves and puts back NumPy's global generator (what ``np.random.seed``, ``np.random.rand`` ... use).

    Its MT19937 state is read and written as bytes at the bit generator's ``ctypes.state_address``
    (checked once against ``get_state()``; where it does not match, ``get_state()`` / ``set_state()``
    are used). The legacy generator also caches a second gaussian, readable only through
    ``get_state()``; so the bytes alone are kept only for a state without a cached gaussian: the
    state put back last had none and nothing drew since (any draw without a cached gaussian changes
    the bytes), or ``get_state()`` said so.
    """

    def __init__(self, np: Any):
        self.np = np
        self.bit_generator = np.random.get_bit_generator() if hasattr(np.random, "get_bit_generator") else None
        self.address: int | None = None
        self.put_back: bytes | None = None  # the bytes last put back (a state without a cached gaussian)
        try:
            address = self.bit_generator.ctypes.state_address
            state = np.random.get_state()
            expected = np.asarray(state[1], dtype="<u4").tobytes() + int(state[2]).to_bytes(4, sys.byteorder, signed=True)
            if state[0] == "MT19937" and ctypes.string_at(address, _MT19937_BYTES) == expected:
                self.address = address
        except (AttributeError, TypeError, ValueError):
            pass

    def usable(self) -> bool:
        """Still the generator this was built for (``np.random.set_bit_generator`` replaces it)."""
        np = self.np
        return self.bit_generator is None or not hasattr(np.random, "get_bit_generator") \
            or np.random.get_bit_generator() is self.bit_generator

    def save(self) -> Any:
        if self.address is None:
            return self.np.random.get_state()
        raw = ctypes.string_at(self.address, _MT19937_BYTES)
        if raw == self.put_back:
            return raw
        state = self.np.random.get_state()
        return state if state[3] else raw  # (has_gauss: a cached gaussian needs the whole state)

    def restore(self, saved: Any) -> None:
        if isinstance(saved, bytes):
            self.np.random.seed(0)  # drops a cached gaussian (the saved state had none); the bytes follow
            ctypes.memmove(self.address, saved, _MT19937_BYTES)
            self.put_back = saved
        else:
            self.np.random.set_state(saved)
            self.put_back = None


class LoadingGenerators:
    """``saved = enter(seed)``: save the training's generators and seed them for loading;
    ``exit(saved)``: put them back (calls may nest)."""

    def __init__(self) -> None:
        self._numpy: _NumpyState | None = None

    def _numpy_state(self) -> _NumpyState | None:
        np = sys.modules.get("numpy")  # (NumPy is optional; torch imports it where it is installed)
        if np is None:
            return None
        if self._numpy is None or not self._numpy.usable():
            self._numpy = _NumpyState(np)
        return self._numpy

    def enter(self, seed: int) -> tuple[Any, Any, Any]:
        numpy_state = self._numpy_state()
        saved = (torch.default_generator.get_state(), random.getstate(),
                 (numpy_state, numpy_state.save()) if numpy_state is not None else None)
        torch.default_generator.manual_seed(seed)
        random.seed(seed)
        if numpy_state is not None:
            numpy_state.np.random.seed(seed % (1 << 32))
        return saved

    def exit(self, saved: tuple[Any, Any, Any]) -> None:
        torch_state, random_state, numpy_saved = saved
        torch.default_generator.set_state(torch_state)
        random.setstate(random_state)
        if numpy_saved is not None:
            numpy_saved[0].restore(numpy_saved[1])


#: the process's one instance (the generators it saves are the process's)
GENERATORS = LoadingGenerators()
