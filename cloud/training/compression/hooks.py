"""Activations saved for backward, stored compressed: ``torch.autograd.graph.saved_tensors_hooks``.

While ``ActivationCompressor.active()`` is entered, every tensor autograd saves goes through the
pack hook, which knows the layer whose forward is running and stores the tensor with that layer's
format: BFP (lossy), Gist sparse form (lossless, for layers the Gist pass marked and when it is
smaller), or as-is. The unpack hook decodes it in backward.

- **One encode per layer call**: the floating tensors a layer's call saves for BFP are gathered
  and, when the call returns, encoded together as one buffer (each tensor padded to whole blocks,
  so no block mixes two tensors), decoded together by the first unpack in backward. A GRU's call
  saves ~400 small tensors per step (one set per time step): encoded one by one, each paid the
  codec's fixed cost (op dispatch, ~20 us); as one group they pay it once. Tensors saved by ops
  outside any layer (the loss) are gathered until ``active()`` exits.
- **Size threshold** ``min_numel``: a group smaller than this is kept as it is (counted). Default
  ``None``: measured once per process and device (``measured_min_numel``): the group size at which
  the codec's fixed cost per call equals its cost per element, so that a group encoded runs at
  least at half the codec's throughput on large tensors.
- Parameters and views of them (same storage), and any other leaf that requires grad (stashed
  weight versions, a pipeline stage's received input), are returned untouched and not counted:
  they are not activations the hooks could free, their owner keeps them alive anyway.
- The model's own inputs (the batch, found by a forward pre-hook on the model) are kept as they
  are (counted): the caller holds the batch through backward, so an encoded copy would add
  memory, not save it.
- Dropout masks (bool tensors, and the float mask of 0 and 1/(1-p) a CPU ``nn.Dropout`` saves)
  are stored as one bit per element plus the one non-zero value (lossless); other non-float tensors (max-pool
  indices, Gist codes) are kept as they are; both counted.
- A tensor saved by two ops (a ReLU's output is saved by the ReLU and by the next conv) is stored
  once and shared; the cache holds only weak references, so it never keeps memory alive. Its
  decoded form is shared too: a group's decoded buffer is kept until the last of its users has
  unpacked (fp32 keeps the originals alive that long anyway), so backward decodes it once.
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

from cloud.training.compression.groups import GroupSlot, SavedGroup, measured_min_numel
from cloud.training.compression.layer_formats import LayerPolicy
from cloud.training.compression.sparse import SparsePacked, count_nonzero_bits, decode_sparse, encode_sparse
from models.numerics import (
    BfpCodec,
    BfpFormat,
    Packed,
    error_stats,
    fused_kernels,
    pack_bits,
    packed_length,
    packed_nbytes,
    unpack_bits,
)

OUTSIDE_LAYERS = "<outside>"  # saved by ops that run outside any leaf module (e.g. the loss)
_CACHE_PRUNE_AT = 1024
StoredKind = Literal["raw", "bfp", "sparse", "bits"]  # as-is, Packed, SparsePacked, a bool tensor as bits


@dataclass
class LayerBytes:
    original: int = 0
    stored: int = 0
    tensors: int = 0


class _Stored:
    """What the pack hook hands autograd: an encoded (or raw) saved tensor."""

    __slots__ = ("kind", "payload", "nbytes", "shape", "scale", "users", "decoded", "owner", "__weakref__")

    def __init__(
        self,
        kind: StoredKind,
        payload: torch.Tensor | Packed | SparsePacked,
        nbytes: int,
        shape: torch.Size | None = None,  # "bits": the mask's shape
        scale: float | None = None,  # "bits" of a float mask: its one non-zero value (None: bool)
    ) -> None:
        self.kind, self.payload, self.nbytes, self.shape, self.scale = kind, payload, nbytes, shape, scale
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
    """Names of the layers the hooks attribute saved tensors to: the leaf modules (no children),
    and modules that own parameters directly (``nn.MultiheadAttention``, whose projections run as
    functions inside its own forward, not as calls of its children)."""
    return [
        name
        for name, m in module.named_modules()
        if name and (not any(True for _ in m.children()) or any(True for _ in m.parameters(recurse=False)))
    ]


def _as_bits(tensor: torch.Tensor, dropout: bool) -> _Stored | None:
    """A bool tensor, or the float32 mask a CPU ``nn.Dropout`` saves (``dropout``: every element 0
    or the one value 1/(1-p), by construction; its maximum is that value, so decoding reproduces
    it bit for bit), as one bit per element; ``None`` for anything else. Not checked element by
    element: a bool comparison of a 64 Ki tensor costs ~0.2 ms on a CPU (tests check the
    gradients bit-identical)."""
    if tensor.dtype == torch.bool:
        mask, scale = tensor, None
    elif dropout and tensor.dtype == torch.float32 and tensor.device.type == "cpu":
        # One compiled pass (fused.py): the bits and the maximum.
        bits = torch.empty(packed_length(tensor.numel(), 1), dtype=torch.uint8)
        scale = float(fused_kernels().pack_mask(tensor.detach().contiguous().view(-1).numpy(), bits.numpy()))
        return _Stored("bits", bits, bits.numel(), tensor.shape, scale) if scale > 0 else None
    elif dropout and tensor.dtype == torch.float32:
        scale = float(tensor.max())
        if not scale > 0:
            return None
        mask = tensor != 0
    else:
        return None
    bits = pack_bits(mask.reshape(-1).view(torch.uint8), 1)
    return _Stored("bits", bits, bits.numel(), tensor.shape, scale)


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
        min_numel: int | None = None,
        mask_bits: bool = True,
    ) -> None:
        """``min_numel``: groups (one layer call's tensors) smaller than this stay as they are;
        ``None``: ``measured_min_numel`` for the model's device, measured on the first ``active()``.
        ``mask_bits``: store dropout masks as bits (False: as they are, to count fp32's bytes)."""
        self.model = model
        self.policy = policy
        self.ssdc_layers = frozenset(ssdc_layers)
        self.generator = generator
        self.min_numel = min_numel
        self.measure_errors = False
        self.layer_errors: dict[str, float] = {}
        self.counters: dict[str, LayerBytes] = {}
        self.kinds: dict[StoredKind, int] = {"raw": 0, "bfp": 0, "sparse": 0, "bits": 0}
        self.live_bytes = 0
        self.peak_live_bytes = 0
        # CPU seconds spent encoding (at each group's close) and decoding since reset_counters.
        self.encode_s = 0.0
        self.decode_s = 0.0
        self._stack: list[tuple[str, dict[torch.dtype, SavedGroup]]] = []
        self._outside: dict[torch.dtype, SavedGroup] = {}
        self._recording = False
        self._leaves = [(name, model.get_submodule(name)) for name in leaf_names(model)]
        self._dropout_layers = {name for name, m in self._leaves if type(m) is nn.Dropout}
        self.mask_bits = mask_bits
        self._layer_hooks: list = []
        self._params = list(model.parameters())
        self._input_storages: set[int] = set()
        self._cache: dict[tuple, tuple[weakref.ref, weakref.ref]] = {}
        self._codecs: dict[BfpFormat, BfpCodec] = {}
        self._param_storages: set[int] = set()
        self._formats: dict[str, BfpFormat | None] = {}

    @property
    def policy(self) -> LayerPolicy:
        return self._policy

    @policy.setter
    def policy(self, policy: LayerPolicy) -> None:
        self._policy = policy
        self._formats = {}  # layer -> format, filled as layers save tensors

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
        if self.min_numel is None:
            device = self._params[0].device.type if self._params else "cpu"
            self.min_numel = measured_min_numel(device)
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
            while self._stack:
                self._close_groups(self._stack.pop()[1])
            self._close_groups(self._outside)
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
                self._stack.append((name, {}))

        return hook

    def _leave_layer(self, module: nn.Module, args: tuple, output: object) -> None:
        if self._recording and self._stack:
            self._close_groups(self._stack.pop()[1])

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor | _Stored | GroupSlot:
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
                if isinstance(stored, GroupSlot):
                    stored.group.users += 1
                else:
                    stored.users += 1
                return stored
        layer, groups = self._stack[-1] if self._stack else (OUTSIDE_LAYERS, self._outside)
        entry = self.counters.setdefault(layer, LayerBytes())
        entry.original += _tensor_nbytes(tensor)
        entry.tensors += 1
        if storage in self._input_storages:
            packed: _Stored | GroupSlot = _Stored("raw", tensor, _tensor_nbytes(tensor))
        else:
            packed = self._encode(tensor, layer, groups)
        if len(self._cache) >= _CACHE_PRUNE_AT:
            self._cache = {k: v for k, v in self._cache.items() if v[0]() is not None and v[1]() is not None}
        self._cache[key] = (weakref.ref(tensor), weakref.ref(packed))
        if isinstance(packed, _Stored):  # a group's bytes are counted when it closes
            entry.stored += packed.nbytes
            self.kinds[packed.kind] += 1
            self._hold(packed, packed.nbytes)
        return packed

    def _hold(self, stored: _Stored | SavedGroup, nbytes: int) -> None:
        self.live_bytes += nbytes
        self.peak_live_bytes = max(self.peak_live_bytes, self.live_bytes)
        stored.owner = self

    def _unpack(self, stored: torch.Tensor | _Stored | GroupSlot) -> torch.Tensor:
        if isinstance(stored, torch.Tensor):
            return stored
        if isinstance(stored, GroupSlot):
            group = stored.group
            started = time.process_time() if group.views is None and group.packed is not None else None
            tensor = group.get(stored.index, self._codec(group.fmt) if group.packed is not None else None)
            if started is not None:
                self.decode_s += time.process_time() - started
            return tensor
        payload = stored.payload
        if stored.kind == "bits":
            assert isinstance(payload, torch.Tensor) and stored.shape is not None
            if stored.scale is not None and payload.device.type == "cpu":
                mask = torch.empty(stored.shape, dtype=torch.float32)
                fused_kernels().unpack_mask(payload.numpy(), stored.scale, mask.view(-1).numpy())
                return mask
            codes = unpack_bits(payload, 1, math.prod(stored.shape)).view(stored.shape)
            if stored.scale is None:
                return codes.view(torch.bool)
            return codes.to(torch.float32).mul_(stored.scale)
        if isinstance(payload, torch.Tensor):  # kept as it was ("raw")
            return payload
        decoded = stored.decoded
        if decoded is None:
            started = time.process_time()
            assert isinstance(payload, SparsePacked)
            decoded = decode_sparse(payload)
            self.decode_s += time.process_time() - started
        stored.users -= 1
        stored.decoded = decoded if stored.users > 0 else None
        return decoded

    # Encoding choice ---------------------------------------------------------------------------

    def _format(self, layer: str) -> BfpFormat | None:
        if layer not in self._formats:
            # Ops outside any layer (the loss) are compressed only when the policy names them:
            # the loss's saved log-probabilities are tiny and very sensitive.
            named = layer != OUTSIDE_LAYERS or self.policy.names(layer)
            self._formats[layer] = self.policy.format_for(layer) if named else None
        return self._formats[layer]

    def _encode(
        self, tensor: torch.Tensor, layer: str, groups: dict[torch.dtype, SavedGroup]
    ) -> _Stored | GroupSlot:
        if (
            self.mask_bits
            and tensor.numel() >= 64
            and (tensor.dtype == torch.bool or layer in self._dropout_layers)
        ):
            mask = _as_bits(tensor, layer in self._dropout_layers)  # a dropout mask: one bit each, lossless
            if mask is not None:
                return mask
        if not tensor.is_floating_point():
            return _Stored("raw", tensor, _tensor_nbytes(tensor))
        fmt = self._format(layer)
        if layer in self.ssdc_layers and tensor.numel() >= (self.min_numel or 0):
            n, itemsize = tensor.numel(), tensor.element_size()
            sparse_bytes = math.ceil(n / 8) + count_nonzero_bits(tensor) * itemsize
            dense_bytes = (
                _tensor_nbytes(tensor)
                if fmt is None
                else packed_nbytes(n, fmt, int(fmt.outlier_fraction * n), itemsize)
            )
            if sparse_bytes < dense_bytes:  # Gist: sparse only when sparsity is high enough to pay
                started = time.process_time()
                sparse = encode_sparse(tensor)
                self.encode_s += time.process_time() - started
                return _Stored("sparse", sparse, sparse.nbytes)
        if fmt is None:
            return _Stored("raw", tensor, _tensor_nbytes(tensor))
        group = groups.get(tensor.dtype)
        if group is None:
            group = groups[tensor.dtype] = SavedGroup(layer, fmt)
        return GroupSlot(group, group.add(tensor))

    def _close_groups(self, groups: dict[torch.dtype, SavedGroup]) -> None:
        """Encode each group a layer call gathered (one encode per group), or keep it raw when it is
        smaller than ``min_numel``; count its bytes."""
        for group in groups.values():
            tensors = group.tensors or []
            original = sum(_tensor_nbytes(t) for t in tensors)
            encode = group.numel >= (self.min_numel or 0)
            codec = self._codec(group.fmt) if encode else None
            started = time.process_time() if encode else 0.0  # a raw group costs no clock read
            group.close(codec, original)
            if codec is not None and self.measure_errors:
                # The probe's decode is the one backward would make: keep it for backward (probe
                # steps hold the decoded buffer from forward on, as fp32 would hold the originals).
                reference = torch.cat([t.detach().reshape(-1) for t in tensors])
                approx = torch.cat([t.reshape(-1) for t in group.decode_with(codec)])
                error = _relative_error(reference, approx)
                self.layer_errors[group.layer] = max(error, self.layer_errors.get(group.layer, 0.0))
            if encode:
                self.encode_s += time.process_time() - started
            self.counters[group.layer].stored += group.nbytes
            self.kinds["bfp" if encode else "raw"] += 1 if encode else len(tensors)
            self._hold(group, group.nbytes)
        groups.clear()

    def _codec(self, fmt: BfpFormat) -> BfpCodec:
        codec = self._codecs.get(fmt)
        if codec is None:
            codec = self._codecs[fmt] = BfpCodec(fmt, self.generator, use_kernels=True)
        return codec
