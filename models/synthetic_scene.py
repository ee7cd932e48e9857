"""The synthetic camera scene: shapes of several classes that enter, move, dwell and leave, over a
background with slow lighting drift and sensor noise, with stretches of empty scene between them.

A scene is a plan (a list of `Segment` values, drawn once from a seed) plus a renderer, so the
ground truth of frame ``i`` is known without rendering it and the model's training data is drawn
from the same renderer the camera serves.

Invariant: ``SceneSynth(seed=s, ...)`` renders the same pixels and the same ground truth for the
same frame index on every run; the dominant label of a frame is the class of its one object, or
``"empty"``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

CLASSES = ("circle", "square", "triangle")
LABELS = (*CLASSES, "empty")  # the scene model's output order
# BGR colours: distinct hues so that a tiny CNN separates classes under lighting drift
COLOURS = {"circle": (40, 40, 220), "square": (40, 200, 40), "triangle": (220, 80, 30)}


@dataclass(frozen=True)
class Segment:
    """One stretch of the scene: an object (or none) that moves from ``start`` to ``stop``, then dwells."""

    first_frame: int
    n_frames: int
    label: str  # a class or "empty"
    size: float = 0.0  # radius / half side, pixels
    start: tuple[float, float] = (0.0, 0.0)
    stop: tuple[float, float] = (0.0, 0.0)
    move_frames: int = 0

    def position(self, frame: int) -> tuple[float, float]:
        t = min(1.0, (frame - self.first_frame) / max(1, self.move_frames))
        return (
            self.start[0] + t * (self.stop[0] - self.start[0]),
            self.start[1] + t * (self.stop[1] - self.start[1]),
        )


@dataclass(frozen=True)
class SceneObject:
    label: str
    bbox: tuple[int, int, int, int]  # x0, y0, x1, y1 (pixels, inclusive-exclusive)


def _point(rng: np.random.Generator, width: int, height: int, margin: float) -> tuple[float, float]:
    return (float(rng.uniform(margin, width - margin)), float(rng.uniform(margin, height - margin)))


def plan_segments(
    rng: np.random.Generator, width: int, height: int, fps: float, n_frames: int
) -> list[Segment]:
    """Alternate object segments (move ~1.5 s, dwell ~2-4 s) with occasional empty stretches."""
    segments: list[Segment] = []
    frame = 0
    while frame < n_frames:
        if segments and segments[-1].label != "empty" and rng.random() < 0.35:
            length = int(fps * rng.uniform(2.0, 4.0))
            segments.append(Segment(frame, length, "empty"))
        else:
            label = CLASSES[int(rng.integers(len(CLASSES)))]
            size = float(rng.uniform(0.08, 0.14) * min(width, height))
            start, stop = _point(rng, width, height, size + 2), _point(rng, width, height, size + 2)
            move = int(fps * rng.uniform(1.0, 2.0))
            length = move + int(fps * rng.uniform(2.0, 4.0))
            segments.append(Segment(frame, length, label, size, start, stop, move))
        frame += segments[-1].n_frames
    return segments


def object_bbox(label: str, centre: tuple[float, float], size: float) -> tuple[int, int, int, int]:
    x, y = centre
    return (int(round(x - size)), int(round(y - size)), int(round(x + size)) + 1, int(round(y + size)) + 1)


def draw_object(
    image: np.ndarray, label: str, centre: tuple[float, float], size: float, colour: tuple[int, int, int]
) -> None:
    import cv2

    x, y = centre
    if label == "circle":
        cv2.circle(image, (int(round(x)), int(round(y))), int(round(size)), colour, -1, cv2.LINE_AA)
    elif label == "square":
        cv2.rectangle(
            image,
            (int(round(x - size)), int(round(y - size))),
            (int(round(x + size)), int(round(y + size))),
            colour,
            -1,
        )
    elif label == "triangle":
        points = np.array([[x, y - size], [x - size, y + size], [x + size, y + size]], dtype=np.int32)
        cv2.fillConvexPoly(image, points, colour, cv2.LINE_AA)
    else:
        raise ValueError(f"unknown class {label!r}")


def background(width: int, height: int) -> np.ndarray:
    """A fixed textured background (a gradient and a few static blobs), so the scene is not flat."""
    import cv2

    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    grey = 90 + 40 * (xs / width) + 20 * (ys / height)
    image = np.repeat(grey[:, :, None], 3, axis=2).astype(np.uint8)
    cv2.rectangle(image, (width // 10, height * 7 // 10), (width // 4, height * 9 // 10), (70, 90, 110), -1)
    cv2.line(image, (0, height // 3), (width, height // 4), (120, 120, 120), 2)
    return image


def render(
    base: np.ndarray,
    objects: list[tuple[str, tuple[float, float], float]],
    lighting: float,
    noise: np.ndarray | None,
) -> np.ndarray:
    """Pure pixels: background + objects, scaled by ``lighting`` (~1.0), plus additive noise."""
    image = base.copy()
    for label, centre, size in objects:
        draw_object(image, label, centre, size, COLOURS[label])
    pixels = image.astype(np.float32) * lighting
    if noise is not None:
        pixels += noise
    return np.clip(pixels, 0, 255).astype(np.uint8)


class SceneSynth:
    """Frames and ground truth of one deterministic scene."""

    def __init__(
        self,
        *,
        seed: int = 0,
        width: int = 320,
        height: int = 240,
        fps: float = 10.0,
        n_frames: int = 100_000,
        noise_sigma: float = 3.0,
        drift: float = 0.15,
        drift_period_s: float = 60.0,
        brightness: float = 1.0,
    ) -> None:
        self.width, self.height, self.fps = width, height, fps
        self.brightness = brightness  # < 1: a dimmer site than the scene model's training frames
        self.seed, self.noise_sigma = seed, noise_sigma
        self.drift, self.drift_period_s = drift, drift_period_s
        self.segments = plan_segments(np.random.default_rng(seed), width, height, fps, n_frames)
        self._starts = [segment.first_frame for segment in self.segments]
        self._base = background(width, height)

    def segment_at(self, frame: int) -> Segment:
        import bisect

        index = bisect.bisect_right(self._starts, frame) - 1
        return self.segments[min(max(index, 0), len(self.segments) - 1)]

    def lighting(self, frame: int) -> float:
        return self.brightness * (
            1.0 + self.drift * math.sin(2 * math.pi * frame / (self.fps * self.drift_period_s))
        )

    def objects(self, frame: int) -> list[SceneObject]:
        segment = self.segment_at(frame)
        if segment.label == "empty":
            return []
        return [SceneObject(segment.label, object_bbox(segment.label, segment.position(frame), segment.size))]

    def dominant(self, frame: int) -> str:
        return self.segment_at(frame).label

    def frame(self, index: int) -> np.ndarray:
        """BGR uint8 (height, width, 3); noise is seeded per frame so any frame renders alone."""
        segment = self.segment_at(index)
        objects = [] if segment.label == "empty" else [(segment.label, segment.position(index), segment.size)]
        noise = None
        if self.noise_sigma > 0:
            rng = np.random.default_rng((self.seed, index))
            noise = rng.normal(0.0, self.noise_sigma, (self.height, self.width, 3)).astype(np.float32)
        return render(self._base, objects, self.lighting(index), noise)

    def ground_truth(self, index: int, ts: float) -> dict:
        """One line of the ground-truth JSONL file."""
        return {
            "frame": index,
            "ts": ts,
            "dominant": self.dominant(index),
            "objects": [{"class": o.label, "bbox": list(o.bbox)} for o in self.objects(index)],
        }


def random_training_frame(
    rng: np.random.Generator, width: int, height: int, base: np.ndarray
) -> tuple[np.ndarray, str]:
    """One frame for the scene model's dataset: a random class (or empty), place, size, light, noise."""
    label = LABELS[int(rng.integers(len(LABELS)))]
    objects = []
    if label != "empty":
        size = float(rng.uniform(0.08, 0.14) * min(width, height))
        centre = (float(rng.uniform(size, width - size)), float(rng.uniform(size, height - size)))
        objects.append((label, centre, size))
    lighting = float(rng.uniform(0.82, 1.18))
    noise = rng.normal(0.0, float(rng.uniform(0.0, 5.0)), (height, width, 3)).astype(np.float32)
    return render(base, objects, lighting, noise), label
