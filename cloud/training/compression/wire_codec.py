"""BFP wire codecs for the pipeline transport: activations and gradients cross stages as the
self-describing bytes of ``models.numerics.pack_for_wire`` (mantissas, exponents, side entries).

``register_wire_codecs()`` registers ``bfp8``, ``bfp6`` and ``bfp4`` (block 32, nearest rounding,
uniform mantissas) with ``cloud.training.comm``; every rank calls it before the first send, so any
rank can decode what any other sends (the codec id travels in the message header).

Invariant: ``decode(encode(t), t.shape, t.dtype)`` has t's shape and dtype and is within the
format's error bound of t (``BfpCodec.error_bound``); non-finite values cross exactly.
"""

from __future__ import annotations

import torch

from cloud.training import comm
from models.numerics import BfpCodec, BfpFormat, pack_for_wire, unpack_from_wire

WIRE_FORMATS = {f"bfp{m}": BfpFormat(mantissa_bits=m) for m in (8, 6, 4)}
WIRE_CODEC_NAMES = ("fp32", *WIRE_FORMATS)


class BfpWireCodec:
    def __init__(self, name: str, fmt: BfpFormat) -> None:
        self.name = name
        self.codec_id = 16 + fmt.mantissa_bits  # 0 is fp32; ids are shared by every rank
        self.fmt = fmt
        self._codec = BfpCodec(fmt, use_kernels=True)

    def encode(self, tensor: torch.Tensor) -> torch.Tensor:
        return pack_for_wire(self._codec.encode(tensor.detach()))

    def decode(self, payload: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        packed = unpack_from_wire(payload)
        if packed.shape != tuple(shape) or packed.dtype != dtype:
            raise ValueError(
                f"BFP payload holds {packed.dtype}{list(packed.shape)}, header says {dtype}{list(shape)}"
            )
        tensor = self._codec.decode(packed)  # decodes by packed.fmt, whatever the sender's format
        # The receiver marks it requires_grad: give it storage of its own, not a slice of a block buffer.
        return tensor if tensor._base is None else tensor.clone()


def register_wire_codecs() -> None:
    for name, fmt in WIRE_FORMATS.items():
        comm.register_codec(BfpWireCodec(name, fmt))
