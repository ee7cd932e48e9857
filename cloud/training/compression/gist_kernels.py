"""Fused CPU kernels for Gist's binarized ReLU -> MaxPool pair (``gist.py``): one compiled pass
forward (window maxima, argmax positions, ReLU, blocked bits, planar packing) and one backward
(unpack, scatter of the kept gradients), instead of a plane copy, a scan of four torch ops per
window position, packing, and an index gather plus ``max_pool2d_with_indices_backward``.

On a CPU under load every torch op costs 10-25 us of dispatch and one pass over memory; the
suite's Conv1d pays two such pairs per step on (64, 16, 64) and (64, 32, 32) inputs, where the
torch path took ~1.6 ms of a ~6 ms step (forward + backward, one thread). numba and the codec's
kernels (``models/numerics/fused.py``) are loaded by the hooks of a trainer anyway.

Covered: windows of 1 x 2 (MaxPool1d(2)) and 2 x 2 (MaxPool2d(2)), the common pools, on float32
CPU inputs (any layout: made contiguous) and float32 CPU gradients. Other windows and devices,
and an input whose window holds a NaN (``max_pool2d`` picks the last NaN; the scan below would
not), take the torch path.

Invariant: for every input they accept, the kernels produce the torch path's pooled values,
codes and packed bytes, and the gradient ``max_pool2d(relu(x))``'s backward gives, bit for bit
(signed zeros included): tests/compression/test_hooks_gist.py and test_gist_kernels.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from models.numerics.fused import pack_codes, unpack_planes


@njit(cache=True, nogil=True)
def binarize_forward(x, h, w, two_rows, blocked_bit, width, pooled, codes, packed):
    """``x``: planes of h x w float32, flat; windows of 1 x 2 or (``two_rows``) 2 x 2. ``pooled``
    (flat, one per window, row-major) receives relu(window maximum); ``codes`` (uint8, the same
    order) the position of the first maximum in row-major window order plus ``1 << blocked_bit``
    where the pooled value is <= 0; ``packed`` those codes in the planar layout of ``width``
    bits. False (outputs unspecified) when a window holds a NaN. Written out per window position,
    branch-free (selects), with constant strides: a loop over a variable window size, or a slice
    per window, measured 10-20x slower."""
    out_h, out_w = (h // 2 if two_rows else h), w // 2
    blocked = np.uint8(1 << blocked_bit)
    zero = np.float32(0.0)
    seen_nan = False
    k = 0
    for plane_start in range(0, x.shape[0], h * w):
        for i in range(out_h):
            row_start = plane_start + (2 * i if two_rows else i) * w
            top = x[row_start : row_start + 2 * out_w]
            bottom = x[row_start + w : row_start + w + 2 * out_w] if two_rows else top
            best_row, code_row = pooled[k : k + out_w], codes[k : k + out_w]
            for j in range(out_w):
                # Strictly larger moves the position: ties keep the first, as max_pool2d does.
                best, value = top[2 * j], top[2 * j + 1]
                nan = (best != best) | (value != value)
                larger = value > best
                position = np.uint8(1) if larger else np.uint8(0)
                best = value if larger else best
                if two_rows:
                    value = bottom[2 * j]
                    nan |= value != value
                    larger = value > best
                    position = np.uint8(2) if larger else position
                    best = value if larger else best
                    value = bottom[2 * j + 1]
                    nan |= value != value
                    larger = value > best
                    position = np.uint8(3) if larger else position
                    best = value if larger else best
                seen_nan |= nan
                code_row[j] = position | (blocked if best <= zero else np.uint8(0))
                # relu: -0.0 stays -0.0 and a negative maximum becomes +0.0, as torch.relu does.
                best_row[j] = zero if best < zero else best
            k += out_w
    if seen_nan:
        return False
    pack_codes(codes, k, width, packed)
    return True


@njit(cache=True, nogil=True)
def binarize_backward(packed, h, w, two_rows, blocked_bit, width, grad_pooled, grad_x):
    """``grad_x`` (flat planes of h x w, float32) = 0 everywhere but at each open window's argmax,
    which gets ``0.0 + g`` (what the pool's backward adds into zeros; a blocked window's +0.0 is
    the zero already there). ``grad_pooled``: flat, one float32 per window."""
    n = grad_pooled.shape[0]
    if width == 8:
        codes = packed
    else:
        codes = np.empty(n, dtype=np.uint8)
        unpack_planes(packed, n, width, codes)
    grad_x[:] = 0.0
    out_h, out_w = (h // 2 if two_rows else h), w // 2
    zero = np.float32(0.0)
    for window_row in range(grad_x.shape[0] // (h * w) * out_h):
        plane, i = divmod(window_row, out_h)
        corner = plane * h * w + (2 * i if two_rows else i) * w  # of the row's first window
        k = window_row * out_w
        code_row, grad_row = codes[k : k + out_w], grad_pooled[k : k + out_w]
        for j in range(out_w):
            code = code_row[j]
            if not code >> blocked_bit:  # open: the argmax is row code >> 1, column code & 1
                grad_x[corner + (w if code >> 1 else 0) + 2 * j + (code & 1)] = zero + grad_row[j]
