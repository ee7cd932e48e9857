"""Per-thread scratch buffers for the codec's intermediate passes.

A fresh CPU tensor of an activation's size costs page faults on first touch (often more than the
arithmetic that fills it), so the codec writes its intermediates with ``out=`` into buffers that
are kept per (thread, device, name, dtype) and grown, never shrunk. A view of a given shape is
kept too and handed out again while its buffer stays the same: under a loaded CPU even a slice
or ``view`` costs microseconds of dispatch, and an encode asks for several per tensor.

Invariant: a buffer handed out is only valid until the next ``get`` of the same name on the same
thread; nothing returned to a caller outside the codec ever aliases a scratch buffer.
"""

from __future__ import annotations

import math
import threading

import torch

_LOCAL = threading.local()
_MAX_VIEWS = 256  # distinct (name, dtype, shape) views kept per pool


class Scratch:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}
        self._views: dict[tuple[str, torch.dtype, tuple[int, ...]], tuple[torch.Tensor, torch.Tensor]] = {}

    def get(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A 1-D tensor of ``numel`` elements with unspecified contents."""
        return self.shaped(name, (numel,), dtype)

    def get2d(self, name: str, rows: int, columns: int, dtype: torch.dtype) -> torch.Tensor:
        return self.shaped(name, (rows, columns), dtype)

    def shaped(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A contiguous tensor of ``shape`` at the start of the buffer, contents unspecified."""
        view_key = (name, dtype, shape)
        cached = self._views.get(view_key)
        key = (name, dtype)
        buffer = self._buffers.get(key)
        if cached is not None and cached[0] is buffer:
            return cached[1]
        numel = math.prod(shape)
        if buffer is None or buffer.numel() < numel:
            buffer = self._buffers[key] = torch.empty(max(numel, 1024), dtype=dtype, device=self.device)
        view = buffer[:numel].view(shape)
        if len(self._views) >= _MAX_VIEWS:
            self._views.clear()
        self._views[view_key] = (buffer, view)
        return view

    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._buffers.values())


def scratch(device: torch.device) -> Scratch:
    pools = getattr(_LOCAL, "pools", None)
    if pools is None:
        pools = _LOCAL.pools = {}
    pool = pools.get(device)
    if pool is None:
        pool = pools[device] = Scratch(device)
    return pool
