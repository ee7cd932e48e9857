"""Activations saved for backward, stored compressed: ``torch.autograd.graph.saved_tensors_hooks``.

While ``ActivationCompressor.active()`` is entered, every tensor autograd saves goes through the
pack hook, which knows the layer (leaf module) whose forward is running and encodes the tensor
with that layer's format: BFP (lossy), Gist sparse form (lossless, for layers the Gist pass marked
and when it is smaller), or as-is. The unpack hook decodes it in backward.

- Parameters and views of them (same storage), and any other leaf that requires grad (stashed
  weight versions, a pipeline stage's received input), are returned untouched and not counted:
  they are not activations the hooks could free, their owner keeps them alive anyway.
- Floating tensors below ``min_numel`` elements (default 32768, 128 KiB in fp32) are kept as they
  are (counted): encoding and decoding one costs a fixed ~0.5-1 ms of op dispatch on a CPU
  whatever its size (about 5% of a small CNN's training step) to save under 100 KiB, under 2% of
  the fp32 bytes saved for backward in either benchmark CNN.
- The model's own inputs (the batch, found by a forward pre-hook on the model) are kept as they
  are (counted): the caller holds the batch through backward, so an encoded copy would add
  memory, not save it.
- Non-float tensors (max-pool indices, Gist masks) are kept as they are and counted.
- A tensor saved by two ops (a ReLU's output is saved by the ReLU and by the next conv) is encoded
  once and shared; the cache holds only weak references, so it never keeps memory alive. Its
  decoded form is shared too: the first unpack keeps it until the last of its users unpacks it
  (fp32 keeps the original alive that long anyway), so backward decodes it once.
- The per-layer forward hooks that tell the pack hook which layer is running are registered on
  the first ``active()`` and stay (they only record while active): registering them per step
  cost about a millisecond.

Invariant: ``counters[layer].stored`` is the sum of the real bytes held for backward by that
layer's saved tensors (each distinct tensor counted once), and ``live_bytes`` returns to zero once
the autograd graph that holds them is freed.
"""

from __future__ import annotations

import contextlib
import math
import time
import weakref
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from cloud.training.compression.layer_formats import LayerPolicy
from cloud.training.compression.sparse import SparsePacked, count_nonzero_bits, decode_sparse, encode_sparse
from models.numerics import BfpCodec, BfpFormat, Packed, error_stats, packed_nbytes

OUTSIDE_LAYERS = "<outside>"  # saved by ops that run outside any leaf module (e.g. the loss)
_CACHE_PRUNE_AT = 1024
StoredKind = Literal["raw", "bfp", "sparse"]  # as-is (a tensor), Packed, SparsePacked


@dataclass
class LayerBytes:
    original: int = 0
    stored: int = 0
    tensors: int = 0


class _Stored:
    """What the pack hook hands autograd: an encoded (or raw) saved tensor."""

    __slots__ = ("kind", "payload", "nbytes", "users", "decoded", "owner", "__weakref__")

    def __init__(self, kind: StoredKind, payload: torch.Tensor | Packed | SparsePacked, nbytes: int) -> None:
        self.kind, self.payload, self.nbytes = kind, payload, nbytes
        self.users = 1  # saved-tensor slots that hold this encoding and have not unpacked it yet
        self.decoded: torch.Tensor | None = None
        self.owner: ActivationCompressor | None = None  # whose live_bytes count it

    def __del__(self) -> None:  # cheaper than a weakref.finalize per saved tensor
        if self.owner is not None:
            self.owner.live_bytes -= self.nbytes


def _relative_error(reference: torch.Tensor, approx: torch.Tensor) -> float:
    """||approx - reference|| / ||reference||: two float32 passes; float64 ``error_stats`` only when
    the norm is not finite (non-finite elements, or overflow)."""
    norm = float(torch.linalg.vector_norm(reference))
    if math.isfinite(norm) and norm > 0:
        return float(torch.dist(approx, reference)) / norm
    return error_stats(reference, approx).relative_error


def leaf_names(module: nn.Module) -> list[str]:
    """Names of the leaf modules (no children), the layers the hooks attribute saved tensors to."""
    return [name for name, m in module.named_modules() if name and not any(True for _ in m.children())]


def _tensor_nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class ActivationCompressor:
    """Owns the hooks for one model. Not thread-safe: one forward/backward at a time per instance."""

    def __init__(
        self,
        model: nn.Module,
        policy: LayerPolicy,
        *,
        ssdc_layers: Collection[str] = (),
        generator: torch.Generator | None = None,
        min_numel: int = 32768,
    ) -> None:
        self.model = model
        self.policy = policy
        self.ssdc_layers = frozenset(ssdc_layers)
        self.generator = generator
        self.min_numel = min_numel  # below this, encoding costs more time than the bytes are worth
        self.measure_errors = False
        self.layer_errors: dict[str, float] = {}
        self.counters: dict[str, LayerBytes] = {}
        self.kinds: dict[StoredKind, int] = {"raw": 0, "bfp": 0, "sparse": 0}
        self.live_bytes = 0
        self.peak_live_bytes = 0
        # CPU seconds spent in the pack (encode) and unpack (decode) hooks since reset_counters.
        self.encode_s = 0.0
        self.decode_s = 0.0
        self._stack: list[str] = []
        self._recording = False
        self._leaves = [(name, model.get_submodule(name)) for name in leaf_names(model)]
        self._layer_hooks: list = []
        self._params = list(model.parameters())
        self._input_storages: set[int] = set()
        self._cache: dict[tuple, tuple[weakref.ref, weakref.ref]] = {}
        self._codecs: dict[BfpFormat, BfpCodec] = {}
        self._param_storages: set[int] = set()

    def reset_counters(self) -> None:
        self.counters.clear()
        self.kinds = dict.fromkeys(self.kinds, 0)
        self.layer_errors.clear()
        self.peak_live_bytes = self.live_bytes
        self.encode_s = self.decode_s = 0.0

    def total(self) -> LayerBytes:
        total = LayerBytes()
        for entry in self.counters.values():
            total.original += entry.original
            total.stored += entry.stored
            total.tensors += entry.tensors
        return total

    @contextlib.contextmanager
    def active(self) -> Iterator[ActivationCompressor]:
        self._param_storages = {p.untyped_storage().data_ptr() for p in self._params}
        if not self._layer_hooks:
            self._layer_hooks.append(self.model.register_forward_pre_hook(self._note_inputs))
            for name, module in self._leaves:
                self._layer_hooks.append(module.register_forward_pre_hook(self._enter_layer(name)))
                self._layer_hooks.append(module.register_forward_hook(self._leave_layer, always_call=True))
        self._recording = True
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield self
        finally:
            self._recording = False
            self._stack.clear()
            self._cache.clear()
            self._input_storages.clear()

    def remove_hooks(self) -> None:
        """Detach the per-layer hooks from the model (``active()`` registers them again)."""
        for handle in self._layer_hooks:
            handle.remove()
        self._layer_hooks.clear()

    # Hooks -------------------------------------------------------------------------------------

    def _note_inputs(self, module: nn.Module, args: tuple) -> None:
        if self._recording:
            self._input_storages.update(
                a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)
            )

    def _enter_layer(self, name: str):
        def hook(module: nn.Module, args: tuple) -> None:
            if self._recording:
                self._stack.append(name)

        return hook

    def _leave_layer(self, module: nn.Module, args: tuple, output: object) -> None:
        if self._recording and self._stack:
            self._stack.pop()

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor | _Stored:
        # Leaves that require grad (parameters, stashed weight versions, a pipeline stage's
        # received input) are held alive by their owner: encoding them would save nothing.
        if tensor.requires_grad and tensor.grad_fn is None:
            return tensor
        storage = tensor.untyped_storage().data_ptr()
        if storage in self._param_storages:
            return tensor
        key = (storage, tensor.storage_offset(), tensor.shape, tensor.stride(), tensor.dtype, tensor._version)
        cached = self._cache.get(key)
        if cached is not None:
            source, stored = cached[0](), cached[1]()
            # A live source with the same storage, view and version has the same bytes.
            if source is not None and stored is not None:
                stored.users += 1
                return stored
        layer = self._stack[-1] if self._stack else OUTSIDE_LAYERS
        started = time.process_time()
        if storage in self._input_storages:
            stored = _Stored("raw", tensor, _tensor_nbytes(tensor))
        else:
            stored = self._encode(tensor, layer)
        self.encode_s += time.process_time() - started
        if len(self._cache) >= _CACHE_PRUNE_AT:
            self._cache = {k: v for k, v in self._cache.items() if v[0]() is not None and v[1]() is not None}
        self._cache[key] = (weakref.ref(tensor), weakref.ref(stored))
        entry = self.counters.setdefault(layer, LayerBytes())
        entry.original += _tensor_nbytes(tensor)
        entry.stored += stored.nbytes
        entry.tensors += 1
        self.kinds[stored.kind] += 1
        self.live_bytes += stored.nbytes
        self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
        stored.owner = self
        return stored

    def _unpack(self, stored: torch.Tensor | _Stored) -> torch.Tensor:
        if isinstance(stored, torch.Tensor):
            return stored
        payload = stored.payload
        if isinstance(payload, torch.Tensor):  # kept as it was ("raw")
            return payload
        tensor = stored.decoded
        if tensor is None:
            started = time.process_time()
            if isinstance(payload, SparsePacked):
                tensor = decode_sparse(payload)
            else:
                tensor = self._codec(payload.fmt).decode(payload)
            self.decode_s += time.process_time() - started
        stored.users -= 1
        stored.decoded = tensor if stored.users > 0 else None
        return tensor

    # Encoding choice ---------------------------------------------------------------------------

    def _encode(self, tensor: torch.Tensor, layer: str) -> _Stored:
        if not tensor.is_floating_point() or tensor.numel() < self.min_numel:
            return _Stored("raw", tensor, _tensor_nbytes(tensor))
        # Ops outside any layer (the loss) are compressed only when the policy names them: the
        # loss's saved log-probabilities are tiny and very sensitive.
        fmt = self.policy.format_for(layer) if layer != OUTSIDE_LAYERS or self.policy.names(layer) else None
        if layer in self.ssdc_layers:
            n, itemsize = tensor.numel(), tensor.element_size()
            sparse_bytes = math.ceil(n / 8) + count_nonzero_bits(tensor) * itemsize
            dense_bytes = (
                _tensor_nbytes(tensor)
                if fmt is None
                else packed_nbytes(n, fmt, int(fmt.outlier_fraction * n), itemsize)
            )
            if sparse_bytes < dense_bytes:  # Gist: sparse only when sparsity is high enough to pay
                sparse = encode_sparse(tensor)
                return _Stored("sparse", sparse, sparse.nbytes)
        if fmt is None:
            return _Stored("raw", tensor, _tensor_nbytes(tensor))
        packed = self._codec(fmt).encode(tensor)
        stored = _Stored("bfp", packed, packed.nbytes)
        if self.measure_errors:
            # The probe's decode is the one backward would make: keep it for backward (probe
            # steps hold the decoded tensor from forward on, as fp32 would hold the original).
            stored.decoded = self._codec(fmt).decode(packed)
            error = _relative_error(tensor.detach(), stored.decoded)
            self.layer_errors[layer] = max(error, self.layer_errors.get(layer, 0.0))
        return stored

    def _codec(self, fmt: BfpFormat) -> BfpCodec:
        codec = self._codecs.get(fmt)
        if codec is None:
            codec = self._codecs[fmt] = BfpCodec(fmt, self.generator, use_kernels=True)
        return codec
