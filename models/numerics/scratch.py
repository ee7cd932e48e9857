"""Per-thread scratch buffers for the codec's intermediate passes.

A fresh CPU tensor of an activation's size costs page faults on first touch (often more than the
arithmetic that fills it), so the codec writes its intermediates with ``out=`` into buffers that
are kept per (thread, device, name, dtype) and grown, never shrunk.

Invariant: a buffer handed out is only valid until the next ``get`` of the same name on the same
thread; nothing returned to a caller outside the codec ever aliases a scratch buffer.
"""

from __future__ import annotations

import threading

import torch

_LOCAL = threading.local()


class Scratch:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def get(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A 1-D tensor of ``numel`` elements with unspecified contents."""
        key = (name, dtype)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < numel:
            buffer = self._buffers[key] = torch.empty(max(numel, 1024), dtype=dtype, device=self.device)
        return buffer[:numel]

    def get2d(self, name: str, rows: int, columns: int, dtype: torch.dtype) -> torch.Tensor:
        return self.get(name, rows * columns, dtype).view(rows, columns)

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
