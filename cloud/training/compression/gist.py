"""Gist (ISCA'18) layer-pair encodings, chosen by a ``torch.fx`` pass over the model.

- ReLU -> MaxPool2d or MaxPool1d (non-overlapping windows): **binarize**. The pair becomes one module whose
  backward keeps, per pooling window, the argmax as a position inside the window (log2(kh*kw)
  bits) and one bit "the pooled ReLU output is <= 0", in a planar width of 2, 4 or 8 bits, instead
  of the fp32 ReLU output and int64 pool indices: 4 bits per 2x2 window, 1 bit per ReLU output.
  Lossless. A 1-D pool is the 2-D case with (1, k) windows. On float32 CPU tensors with 1x2 or
  2x2 windows the pair runs compiled (``gist_kernels.py``: the same codes and gradient bits).
- Dropout: its mask (saved by PyTorch as one byte per element) is stored as bits by
  ``ActivationCompressor``, like every bool tensor saved for backward. Lossless.
- ReLU -> Conv/Linear: **sparse storage, dense compute (SSDC)**. The ReLU output (saved by both
  layers) is stored as bitmask + non-zero values when that is smaller than the alternative.
  Lossless; applied by ``ActivationCompressor`` for the layers the plan lists.
- Anything else: **delayed precision reduction (DPR)**: the layer's BFP format from the policy,
  applied after the forward used the full-precision value (the saved-tensor hooks do exactly that).

Invariant: with DPR off (policy fp32), gradients through the transformed module are bit-identical
to the original's (``torch.equal``), because the binarized backward reproduces PyTorch's
``threshold_backward`` (``result <= 0 -> 0``) and max-pool scatter exactly.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Final, Literal

import torch
import torch.fx
from torch import nn
from torch.nn import functional as F

from models.numerics import pack_bits, packed_length, unpack_bits

GistEncoding = Literal["binarize", "ssdc", "dpr"]
BINARIZE: Final = "binarize"
SSDC: Final = "ssdc"
DPR: Final = "dpr"
_DENSE_CONSUMERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


@dataclass(frozen=True)
class GistPair:
    producer: str
    consumer: str
    encoding: GistEncoding

    def __str__(self) -> str:
        return f"{self.producer}->{self.consumer}:{self.encoding}"


@dataclass(frozen=True)
class GistPlan:
    pairs: tuple[GistPair, ...]

    @property
    def ssdc_layers(self) -> frozenset[str]:
        return frozenset(p.producer for p in self.pairs if p.encoding == SSDC)

    def __str__(self) -> str:
        return ", ".join(map(str, self.pairs)) or "(no pairs)"


def _pair(value: int | tuple[int, ...]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def _kernel(pool: nn.MaxPool1d | nn.MaxPool2d) -> tuple[int, int]:
    """The pool's window as a 2-D kernel: a 1-D pool of k is a 2-D pool of (1, k) over (N, C, 1, L)."""
    if isinstance(pool, nn.MaxPool1d):
        return (1, _single(pool.kernel_size))
    return _pair(pool.kernel_size)


def _single(value: int | tuple[int, ...]) -> int:
    return value if isinstance(value, int) else int(value[0])


def binarizable(pool: nn.Module) -> bool:
    """A MaxPool1d or MaxPool2d with non-overlapping, unpadded, undilated windows (each input feeds
    at most one output) of at most 128 elements."""
    if isinstance(pool, nn.MaxPool1d):
        kernel = _single(pool.kernel_size)
        stride = _single(pool.stride if pool.stride is not None else pool.kernel_size)
        geometry = kernel == stride and _single(pool.padding) == 0 and _single(pool.dilation) == 1
    elif isinstance(pool, nn.MaxPool2d):
        kernel2, stride2 = (
            _pair(pool.kernel_size),
            _pair(pool.stride if pool.stride is not None else pool.kernel_size),
        )
        geometry = kernel2 == stride2 and _pair(pool.padding) == (0, 0) and _pair(pool.dilation) == (1, 1)
    else:
        return False
    window = _kernel(pool)
    return (
        geometry and not pool.ceil_mode and not pool.return_indices and window[0] * window[1] <= 128
    )  # position + blocked bit fit one byte


@functools.lru_cache(maxsize=64)
def _window_tables(
    h: int, w: int, kernel: tuple[int, int], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For disjoint kh x kw windows over an h x w plane: the flat index of each window's corner
    (out_h, out_w), the in-window position of each offset from the corner (uint8, indexed by
    ``index - corner``), and the inverse: the offset from the corner of each window code (int64,
    indexed by code; a blocked code maps to the offset of its position, never used). Cached per
    device, so that a GPU's backward does not copy them over every step."""
    kh, kw = kernel
    out_h, out_w = h // kh, w // kw
    corner = torch.arange(out_h).view(-1, 1) * kh * w + torch.arange(out_w).view(1, -1) * kw
    offsets = torch.tensor([r * w + c for r in range(kh) for c in range(kw)], dtype=torch.int64)
    position = torch.zeros((kh - 1) * w + kw, dtype=torch.uint8)
    position[offsets] = torch.arange(kh * kw, dtype=torch.uint8)
    blocked = 1 << _position_bits(kernel)
    by_code = torch.zeros(2 * blocked, dtype=torch.int64)
    by_code[: kh * kw] = offsets
    by_code[blocked : blocked + kh * kw] = offsets
    return corner.to(device), position.to(device), by_code.to(device)


class _ReluMaxPoolBinarized(torch.autograd.Function):
    """Stores one code per pooling window: the argmax position inside the window plus a "blocked"
    bit, in the narrowest planar width (2, 4 or 8 bits) that holds both.

    ReLU's backward zeroes the gradient where its result is <= 0, and the pool's backward sends
    each window's gradient only to its argmax, so the only ReLU result backward ever needs is the
    one at the argmax: the pooled value itself. A window is blocked when ``pooled <= 0`` (not
    ``not pooled > 0``: a NaN result passes its gradient, as in ``threshold_backward``).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, kernel: tuple[int, int]) -> torch.Tensor:
        ctx.meta = (tuple(x.shape), kernel)
        fused = _fused_forward(x, kernel) if _kernels_cover(x, kernel) and x.numel() else None
        if fused is not None:
            pooled, packed = fused
            ctx.save_for_backward(packed)
            return pooled
        pooled, code = _max_and_position(x, kernel)
        if code is None:  # a NaN maximum: PyTorch's own kernel, whose NaN argmax rule we keep
            pooled, indices = F.max_pool2d(torch.relu(x), kernel, kernel, return_indices=True)
            corner, position, _ = _window_tables(x.shape[2], x.shape[3], kernel, x.device)
            # Position of the argmax inside its window: a table lookup on (index - window corner).
            code = position.index_select(0, indices.sub_(corner).view(-1))
        else:
            pooled = torch.relu(pooled)
        blocked_bit = _position_bits(kernel)
        code.add_(torch.le(pooled, 0).view(-1).view(torch.uint8), alpha=1 << blocked_bit)
        ctx.save_for_backward(pack_bits(code, _code_width(kernel)))
        return pooled

    @staticmethod
    def backward(ctx, grad_pooled: torch.Tensor) -> tuple[torch.Tensor, None]:
        (packed,) = ctx.saved_tensors
        shape, kernel = ctx.meta
        if _kernels_cover(grad_pooled, kernel) and math.prod(shape):
            return _fused_backward(packed, grad_pooled, shape, kernel), None
        pooled_shape = (*shape[:2], shape[2] // kernel[0], shape[3] // kernel[1])
        corner, _, offsets = _window_tables(shape[2], shape[3], kernel, grad_pooled.device)
        code = unpack_bits(packed, _code_width(kernel), math.prod(pooled_shape))
        # offsets has an entry for every code: blocked codes map to their window's corner.
        indices = offsets.index_select(0, code.to(torch.int32)).view(pooled_shape)
        indices.add_(corner)
        # A blocked window sends +0.0, what threshold_backward gives; the pool's backward adds the
        # rest into zeros (0 + g), so this is the very arithmetic of the unfused pair: bit-identical.
        # Multiplying by 1.0 / 0.0 gives g / +-0.0, and +0.0 + -0.0 is +0.0: the same bits as a
        # masked_fill (measured ~4x slower with its bool mask), unless g holds inf or NaN.
        open_windows = torch.lt(
            code.view(pooled_shape), 1 << _position_bits(kernel), out=torch.empty_like(grad_pooled)
        )
        if math.isfinite(float(grad_pooled.sum())):
            kept = grad_pooled * open_windows
        else:
            kept = grad_pooled.masked_fill(open_windows == 0, 0.0)
        grad_y = torch.ops.aten.max_pool2d_with_indices_backward(
            kept, grad_pooled.new_empty(shape), list(kernel), list(kernel), [0, 0], [1, 1], False, indices
        )
        return grad_y, None


def _max_and_position(x: torch.Tensor, kernel: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per window of ``x``: its maximum (N, C, out_h, out_w) and the position of the first maximum
    in row-major window order (uint8, flat), the element ``max_pool2d`` picks (it moves on a
    strictly larger value only). ``max(relu(x)) == relu(max(x))``, and where the maximum is <= 0
    the window is blocked, so its position does not matter. ``None`` for the position when a maximum
    is NaN (the scan below cannot see NaN; ``max_pool2d`` takes the last one).

    Why not ``max_pool2d`` itself: its CPU kernel walks each window element by element (~2.7 ms
    for a (128, 32, 8, 8) input on one thread); one copy into kh*kw contiguous planes and a scan of
    four elementwise ops per plane take ~1.2 ms. The scan is in float32: comparisons into bool
    and ``masked_fill``/``where`` on bool masks measured 3-20x slower than float arithmetic."""
    kh, kw = kernel
    n, c, h, w = x.shape
    out_h, out_w = h // kh, w // kw
    windows = x[:, :, : out_h * kh, : out_w * kw].unflatten(3, (out_w, kw)).unflatten(2, (out_h, kh))
    planes = windows.permute(3, 5, 0, 1, 2, 4).reshape(kh * kw, n, c, out_h, out_w)  # one copy
    best = planes[0].clone()
    code = torch.zeros_like(best)  # position as float32, an exact small integer
    larger = torch.empty_like(best)
    for j in range(1, kh * kw):
        torch.gt(planes[j], best, out=larger)  # 1.0 where plane j is strictly larger
        torch.maximum(code, larger.mul_(j), out=code)  # positions only grow along the scan
        torch.maximum(best, planes[j], out=best)
    if math.isnan(float(best.sum())):  # a NaN maximum (or +inf and -inf maxima: also the slow path)
        return best, None
    return best, code.view(-1).to(torch.uint8)


def _kernels_cover(tensor: torch.Tensor, kernel: tuple[int, int]) -> bool:
    """gist_kernels.py runs it: float32 on the CPU, windows of 1 x 2 or 2 x 2."""
    return tensor.device.type == "cpu" and tensor.dtype == torch.float32 and kernel in ((1, 2), (2, 2))


@functools.cache
def _kernels():
    """gist_kernels.py, imported on the first binarized pair that runs on the CPU (numba)."""
    from cloud.training.compression import gist_kernels

    return gist_kernels


def _fused_forward(x: torch.Tensor, kernel: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(relu(pooled), packed codes) from the compiled pass; None when a window holds a NaN."""
    n, c, h, w = x.shape
    kh, kw = kernel
    pooled = x.new_empty((n, c, h // kh, w // kw))
    windows = pooled.numel()
    width = _code_width(kernel)
    packed = torch.empty(packed_length(windows, width), dtype=torch.uint8)
    codes = torch.empty(windows, dtype=torch.uint8)
    done = _kernels().binarize_forward(
        x.detach().contiguous().view(-1).numpy(),
        h,
        w,
        kh == 2,
        _position_bits(kernel),
        width,
        pooled.view(-1).numpy(),
        codes.numpy(),
        packed.numpy(),
    )
    return (pooled, packed) if done else None


def _fused_backward(
    packed: torch.Tensor, grad_pooled: torch.Tensor, shape: tuple[int, ...], kernel: tuple[int, int]
) -> torch.Tensor:
    h, w = shape[2], shape[3]
    grad_x = grad_pooled.new_empty(shape)
    _kernels().binarize_backward(
        packed.numpy(),
        h,
        w,
        kernel[0] == 2,
        _position_bits(kernel),
        _code_width(kernel),
        grad_pooled.contiguous().view(-1).numpy(),
        grad_x.view(-1).numpy(),
    )
    return grad_x


def _position_bits(kernel: tuple[int, int]) -> int:
    return max(1, math.ceil(math.log2(kernel[0] * kernel[1])))


def _code_width(kernel: tuple[int, int]) -> int:
    """Position bits + the blocked bit, rounded up to a planar width (one or two passes to pack)."""
    needed = _position_bits(kernel) + 1
    return next(width for width in (2, 4, 8) if width >= needed)


class ReluMaxPoolBinarized(nn.Module):
    """ReLU followed by a non-overlapping MaxPool1d or MaxPool2d, storing per window its argmax
    position and a blocked bit for backward (lossless). A 1-D pool runs as a 2-D one of (1, k)."""

    def __init__(self, pool: nn.MaxPool1d | nn.MaxPool2d) -> None:
        super().__init__()
        if not binarizable(pool):
            raise ValueError(f"{pool} has overlapping or padded windows; binarize needs them disjoint")
        self.kernel = _kernel(pool)
        self.one_d = isinstance(pool, nn.MaxPool1d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        planes = x.unsqueeze(2) if self.one_d else x
        if planes.dim() != 4 or not torch.is_grad_enabled() or not x.requires_grad:
            pooled = F.max_pool2d(torch.relu(planes), self.kernel, self.kernel)
        else:
            pooled = _ReluMaxPoolBinarized.apply(planes, self.kernel)
        return pooled.squeeze(2) if self.one_d else pooled

    def extra_repr(self) -> str:
        return f"kernel={self.kernel[1] if self.one_d else self.kernel}"


def _is_relu(node: torch.fx.Node, modules: dict[str, nn.Module]) -> bool:
    if node.op == "call_module":
        return isinstance(_called_module(node, modules), nn.ReLU)
    return node.op == "call_function" and node.target in (torch.relu, F.relu)


def _called_module(node: torch.fx.Node, modules: dict[str, nn.Module]) -> nn.Module | None:
    """The module a ``call_module`` node calls (such a node's target is the module's name)."""
    return modules[node.target] if node.op == "call_module" and isinstance(node.target, str) else None


def gist_transform(
    model: nn.Module, *, binarize: bool = True, ssdc: bool = True
) -> tuple[torch.fx.GraphModule, GistPlan]:
    """Trace ``model`` and return (transformed module sharing its parameters, plan).

    Layer names in the plan and the result are the original module names, so a ``LayerPolicy``
    written for the model applies unchanged.
    """
    traced = torch.fx.symbolic_trace(model)
    modules = dict(traced.named_modules())
    pairs: list[GistPair] = []
    for node in list(traced.graph.nodes):
        if not _is_relu(node, modules):
            continue
        producer = str(node.target) if node.op == "call_module" else node.name
        users = list(node.users)
        consumer_modules = [_called_module(user, modules) for user in users]
        if (
            binarize
            and node.op == "call_module"
            and len(users) == 1
            and isinstance(consumer_modules[0], nn.MaxPool1d | nn.MaxPool2d)
            and binarizable(consumer_modules[0])
        ):
            pool_node = users[0]
            fused_name = f"gist_{producer}_{pool_node.target}".replace(".", "_")
            traced.add_submodule(fused_name, ReluMaxPoolBinarized(consumer_modules[0]))
            with traced.graph.inserting_after(pool_node):
                fused = traced.graph.call_module(fused_name, args=node.args)
            pool_node.replace_all_uses_with(fused)
            traced.graph.erase_node(pool_node)
            traced.graph.erase_node(node)
            pairs.append(GistPair(producer, str(pool_node.target), BINARIZE))
        elif (
            ssdc
            and node.op == "call_module"
            and users
            and all(isinstance(m, _DENSE_CONSUMERS) for m in consumer_modules)
        ):
            pairs.append(GistPair(producer, ",".join(str(u.target) for u in users), SSDC))
        else:
            pairs.append(GistPair(producer, ",".join(u.name for u in users), DPR))
    traced.graph.lint()
    traced.recompile()
    traced.delete_all_unused_submodules()
    return traced, GistPlan(tuple(pairs))
