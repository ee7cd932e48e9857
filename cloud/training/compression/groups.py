"""A layer call's saved tensors encoded as one BFP buffer, and the measured size below which
encoding does not pay.

A ``SavedGroup`` gathers the floating tensors one layer call saves (``add``), then ``close``
encodes them together: each flattened and padded to whole blocks, so no block mixes two tensors and
each tensor is encoded exactly as it would be alone. In backward, the first ``get`` decodes the
whole buffer; each slot reads its view of it; the decoded buffer is dropped once every user has
read (``users`` counts saved-tensor slots that have not unpacked yet).

Invariant: ``get(i)`` returns a tensor of ``add``'s i-th shape and dtype whose values are the BFP
round trip of that tensor alone (or the tensor itself when the group was kept raw), and
``nbytes`` is what the group holds for backward after ``close``.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable

import torch

from models.numerics import BfpCodec, BfpFormat, Packed


class SavedGroup:
    __slots__ = (
        "layer",
        "fmt",
        "tensors",
        "shapes",
        "offsets",
        "packed",
        "views",
        "users",
        "nbytes",
        "owner",
    )

    def __init__(self, layer: str, fmt: BfpFormat) -> None:
        self.layer, self.fmt = layer, fmt
        self.tensors: list[torch.Tensor] | None = []  # until close; kept when the group stays raw
        self.shapes: list[torch.Size] = []
        self.offsets: list[int] = [0]
        self.packed: Packed | None = None
        self.views: list[torch.Tensor] | None = None  # the decoded tensors, while users remain
        self.users = 0
        self.nbytes = 0
        self.owner = None  # the compressor whose live_bytes count this group

    def __del__(self) -> None:
        if self.owner is not None:
            self.owner.live_bytes -= self.nbytes

    @property
    def numel(self) -> int:
        return self.offsets[-1]

    def add(self, tensor: torch.Tensor) -> int:
        """Gather ``tensor``; returns its index in the group."""
        assert self.tensors is not None, "the group is closed"
        block = self.fmt.block_size
        self.tensors.append(tensor)
        self.shapes.append(tensor.shape)
        self.offsets.append(self.offsets[-1] + -(-tensor.numel() // block) * block)
        self.users += 1
        return len(self.tensors) - 1

    def close(self, codec: BfpCodec | None, original_bytes: int) -> None:
        """Encode with ``codec`` (``None``: keep the tensors as they are)."""
        tensors = self.tensors
        assert tensors is not None, "the group is closed"
        if codec is None:
            self.nbytes = original_bytes
            return
        pieces: list[torch.Tensor] = []
        for index, tensor in enumerate(tensors):
            flat = tensor.detach().reshape(-1)
            pieces.append(flat)
            pad = self.offsets[index + 1] - self.offsets[index] - flat.numel()
            if pad:
                pieces.append(flat.new_zeros(pad))
        buffer = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
        self.packed = codec.encode(buffer)
        self.nbytes = self.packed.nbytes
        self.tensors = None

    def decode_with(self, codec: BfpCodec) -> list[torch.Tensor]:
        """The decoded tensors (one decode of the buffer, one split into views of it)."""
        assert self.packed is not None
        if self.views is None:
            sizes = [b - a for a, b in zip(self.offsets, self.offsets[1:], strict=False)]
            pieces = codec.decode(self.packed).split(sizes)
            self.views = [
                piece.view(shape)
                if piece.numel() == math.prod(shape)
                else piece[: math.prod(shape)].view(shape)
                for piece, shape in zip(pieces, self.shapes, strict=True)
            ]
        return self.views

    def get(self, index: int, codec: BfpCodec | None) -> torch.Tensor:
        """The ``index``-th tensor, as backward reads it; counts one user done."""
        if self.tensors is not None:  # kept raw
            tensor = self.tensors[index]
        else:
            assert codec is not None
            tensor = self.decode_with(codec)[index]
        self.users -= 1
        if self.users <= 0:
            self.views = None
        return tensor


class GroupSlot:
    """What the pack hook hands autograd for a tensor gathered into a group."""

    __slots__ = ("group", "index", "__weakref__")

    def __init__(self, group: SavedGroup, index: int) -> None:
        self.group, self.index = group, index


@functools.lru_cache(maxsize=8)
def measured_min_numel(device_type: str = "cpu", fmt: BfpFormat = BfpFormat(mantissa_bits=4)) -> int:
    """The group size (elements, whole blocks) at which one encode+decode's fixed cost equals its
    per-element cost, from timing two sizes (best of 20 each): a fit ``t = fixed + n * per_element``.
    Smaller groups would spend most of their codec time on dispatch; larger ones run at more than
    half the codec's large-tensor throughput. Measured once per process and device type. On the
    shared 2-core dev VM under load 7-17, best of 5 gave 10-55 Ki elements from one call to the
    next, best of 20 gave 20-24 Ki (and ~10 ms of codec time)."""
    if device_type != "cpu" and not torch.cuda.is_available():
        raise ValueError(f"device_type: {device_type!r} is not available")
    device = torch.device(device_type)
    codec = BfpCodec(fmt, use_kernels=True)
    small, large = 1024, 1 << 17

    def best(n: int) -> float:
        # A generator of its own: measuring must not move the global one (dropout masks, init).
        tensor = torch.randn(n, generator=torch.Generator().manual_seed(0)).to(device)
        return min(_timed(lambda: codec.decode(codec.encode(tensor)), device) for _ in range(20))

    best(small)  # warm the kernels and scratch buffers
    t_small, t_large = best(small), best(large)
    per_element = max((t_large - t_small) / (large - small), 1e-12)
    fixed = max(t_small - small * per_element, 0.0)
    block = fmt.block_size
    return int(min(max(fixed / per_element, block), large) // block * block)


def _timed(run: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    run()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started
