"""Change detection for camera frames: is this frame different enough from the last one we kept?

Frames are compared at low resolution, in grey, blurred (against sensor noise) and with their mean
brightness removed (against slow lighting drift), to the last *accepted* frame, so slow motion
accumulates until it counts. Pure numpy/OpenCV on arrays: no capture, no threads.

Invariant: a frame is accepted iff the fraction of pixels whose normalised difference from the
reference exceeds ``pixel_threshold`` is at least ``min_changed_fraction``; the reference moves
only when a frame is accepted (the first frame is always accepted).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ChangeConfig:
    enabled: bool = True
    width: int = 80  # about this many columns are compared (every k-th pixel, k = frame width // 80)
    pixel_threshold: float = 18.0  # grey levels, after mean removal
    min_changed_fraction: float = 0.004
    blur: int = 5  # odd Gaussian kernel; 0 disables


def change_signature(image_bgr: np.ndarray, config: ChangeConfig) -> np.ndarray:
    """The small, blurred, zero-mean grey image frames are compared by."""
    import cv2

    # decimate by striding (a view, no arithmetic); the blur below does the averaging against noise
    step = max(1, image_bgr.shape[1] // config.width)
    small = np.ascontiguousarray(image_bgr[::step, ::step])
    grey: np.ndarray = cv2.cvtColor(small, cv2.COLOR_BGR2GRAY).astype(np.float32)
    if config.blur:
        grey = cv2.GaussianBlur(grey, (config.blur, config.blur), 0)
    return grey - float(grey.mean())


def changed_fraction(signature: np.ndarray, reference: np.ndarray, pixel_threshold: float) -> float:
    return float(np.count_nonzero(np.abs(signature - reference) > pixel_threshold)) / signature.size


class ChangeDetector:
    """Keeps the reference signature; one instance per camera, used by one thread."""

    def __init__(self, config: ChangeConfig) -> None:
        self.config = config
        self._reference: np.ndarray | None = None

    def reset(self) -> None:
        """Forget the reference (after a reconnect the scene may have changed arbitrarily)."""
        self._reference = None

    def check(self, image_bgr: np.ndarray) -> tuple[bool, float]:
        """(accepted, changed fraction); the reference moves to this frame if accepted."""
        if not self.config.enabled:
            return True, 1.0
        signature = change_signature(image_bgr, self.config)
        if self._reference is None or self._reference.shape != signature.shape:
            self._reference = signature
            return True, 1.0
        fraction = changed_fraction(signature, self._reference, self.config.pixel_threshold)
        if fraction >= self.config.min_changed_fraction:
            self._reference = signature
            return True, fraction
        return False, fraction
