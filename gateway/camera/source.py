"""Camera ingest: OpenCV ``VideoCapture`` on a file, an MJPEG/RTSP URL or a device index, read in
one thread; sampled, change-detected and JPEG-encoded there; handed to asyncio through a bounded
queue.

Owner: whoever calls `CameraSource.start()` must call `stop()`; the capture thread is the only
writer of the queue, `get()` on the event loop the only reader.

Invariant: every frame read is counted exactly once as sampled out, unchanged, dropped (queue
full, oldest first) or delivered (queued, or taken by `get`): ``frames_read == sampled_out +
unchanged + dropped + delivered`` at any quiet moment. A lost stream is reopened with exponential
backoff; a file ends with ``state == "eof"`` (or loops when asked).
"""

from __future__ import annotations

import asyncio
import collections
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from gateway.camera.change import ChangeConfig, ChangeDetector
from protocol.config import CameraConfig
from protocol.control import CameraSettings
from runtime.backoff import Backoff

if TYPE_CHECKING:  # OpenCV loads in the capture thread, when a camera actually runs
    import cv2

# what the capture thread is doing (/status camera.capture.state)
SourceState = Literal["idle", "connecting", "streaming", "backoff", "eof", "stopped"]
QueueFullPolicy = Literal["drop_oldest", "block"]  # block: files/benchmarks only


@dataclass(frozen=True)
class CameraSourceConfig:
    camera_id: str
    source: str | int  # a file path, an http(s)/rtsp URL, or a device index
    sample_fps: float | None = None  # None: every frame the source gives
    queue_size: int = 32
    full_policy: QueueFullPolicy = "drop_oldest"
    change: ChangeConfig = field(default_factory=ChangeConfig)
    jpeg_quality: int = 80
    encode_jpeg: bool = True
    backoff_initial_s: float = 0.2
    backoff_max_s: float = 5.0
    open_timeout_s: float = 5.0
    read_timeout_s: float = 5.0
    loop_file: bool = False


@dataclass(frozen=True)
class CameraFrame:
    camera_id: str
    seq: int  # index among frames read from this source (over reconnects)
    capture_ts: float
    image: np.ndarray  # BGR uint8
    jpeg: bytes | None  # what an upload sends
    changed_fraction: float


@dataclass
class CameraCounters:
    frames_read: int = 0
    sampled_out: int = 0
    unchanged: int = 0
    dropped: int = 0
    delivered: int = 0
    jpeg_bytes: int = 0
    opens: int = 0
    open_failures: int = 0
    read_failures: int = 0
    reconnects: int = 0
    last_error: str = ""


def is_file_source(source: str | int) -> bool:
    return isinstance(source, str) and "://" not in source and os.path.exists(source)


def open_capture(source: str | int, open_timeout_s: float, read_timeout_s: float) -> cv2.VideoCapture:
    import cv2

    if isinstance(source, int) or (isinstance(source, str) and source.isdigit()):
        return cv2.VideoCapture(int(source))
    params = [
        cv2.CAP_PROP_OPEN_TIMEOUT_MSEC,
        int(open_timeout_s * 1000),
        cv2.CAP_PROP_READ_TIMEOUT_MSEC,
        int(read_timeout_s * 1000),
    ]
    return cv2.VideoCapture(source, cv2.CAP_FFMPEG, params)


class CameraSource:
    def __init__(self, config: CameraSourceConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.counters = CameraCounters()
        self.state: SourceState = "idle"
        self._clock = clock
        self._queue: collections.deque[CameraFrame] = collections.deque()
        self._lock = threading.Lock()
        self._space = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = asyncio.Event()
        self._detector = ChangeDetector(config.change)

    # ---- asyncio side -------------------------------------------------------------------
    async def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("CameraSource already started")
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name=f"camera-{self.config.camera_id}", daemon=True)
        self._thread.start()

    async def stop(self, join_s: float = 10.0) -> None:
        self._stop.set()
        with self._lock:
            self._space.notify_all()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, join_s)
        self.state = "stopped"

    @property
    def finished(self) -> bool:
        """The source ended (file at EOF, or stopped) and everything it delivered was taken."""
        with self._lock:
            return self.state in ("eof", "stopped") and not self._queue

    def queued(self) -> int:
        with self._lock:
            return len(self._queue)

    async def get(self, within_s: float) -> CameraFrame | None:
        """The oldest delivered frame, or None after ``within_s`` seconds or once `finished`."""
        deadline = time.monotonic() + within_s
        while True:
            self._ready.clear()
            with self._lock:
                if self._queue:
                    frame = self._queue.popleft()
                    self._space.notify()
                    return frame
                if self.state in ("eof", "stopped"):
                    return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                async with asyncio.timeout(remaining):  # not wait_for: 3.11 may swallow a cancel
                    await self._ready.wait()
            except TimeoutError:
                return None

    # ---- capture thread -----------------------------------------------------------------
    def _run(self) -> None:
        retry = Backoff(self.config.backoff_initial_s, self.config.backoff_max_s)
        first_open = True
        while not self._stop.is_set():
            self.state = "connecting"
            if not first_open:
                self.counters.reconnects += 1
            first_open = False
            capture = open_capture(self.config.source, self.config.open_timeout_s, self.config.read_timeout_s)
            if not capture.isOpened():
                self.counters.open_failures += 1
                self.counters.last_error = f"cannot open {self.config.source!r}"
            else:
                self.counters.opens += 1
                self._detector.reset()
                got_frames, ended = self._read_until_failure(capture)
                if got_frames:
                    retry.succeeded()
                if ended:
                    capture.release()
                    if not self.config.loop_file:
                        self.state = "eof"
                        self._notify()
                        return
                    continue
            capture.release()
            self.state = "backoff"
            if self._stop.wait(retry.failed()):
                break
        self.state = "stopped"
        self._notify()

    def _read_until_failure(self, capture) -> tuple[bool, bool]:
        """Read frames until stop or failure; (got any frame, the file ended)."""
        self.state = "streaming"
        got = False
        min_gap = 1.0 / self.config.sample_fps if self.config.sample_fps else 0.0
        last_kept = -1e18
        while not self._stop.is_set():
            ok, image = capture.read()
            if not ok or image is None:
                if is_file_source(self.config.source):
                    return got, True
                self.counters.read_failures += 1
                self.counters.last_error = f"read failed on {self.config.source!r}"
                return got, False
            got = True
            now = self._clock()
            seq = self.counters.frames_read
            self.counters.frames_read += 1
            if now - last_kept < min_gap - 5e-4:
                self.counters.sampled_out += 1
                continue
            last_kept = now
            self._offer(seq, now, image)
        return got, False

    def _offer(self, seq: int, now: float, image: np.ndarray) -> None:
        import cv2

        accepted, fraction = self._detector.check(image)
        if not accepted:
            self.counters.unchanged += 1
            return
        jpeg = None
        if self.config.encode_jpeg:
            ok, encoded = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, self.config.jpeg_quality])
            jpeg = encoded.tobytes() if ok else None
            self.counters.jpeg_bytes += len(jpeg or b"")
        frame = CameraFrame(self.config.camera_id, seq, now, image, jpeg, fraction)
        with self._lock:
            if self.config.full_policy == "block":
                while len(self._queue) >= self.config.queue_size and not self._stop.is_set():
                    self._space.wait(0.1)
            elif len(self._queue) >= self.config.queue_size:
                self._queue.popleft()
                self.counters.dropped += 1
                self.counters.delivered -= 1  # it was counted delivered when queued; now it is a drop
            self._queue.append(frame)
            self.counters.delivered += 1
        self._notify()

    def _notify(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._ready.set)
            except RuntimeError:
                pass  # the loop closed between the check and the call: nobody is waiting


def source_config(config: CameraConfig, settings: CameraSettings) -> CameraSourceConfig:
    """The capture settings: the file's knobs, the control plane's source and sample rate."""
    assert settings.source is not None
    source: str | int = int(settings.source) if settings.source.isdigit() else settings.source
    if isinstance(source, str) and source.startswith("file://"):
        source = source[len("file://") :]
    change = ChangeConfig(
        enabled=config.change_detection,
        pixel_threshold=config.change_pixel_threshold,
        min_changed_fraction=config.change_min_fraction,
    )
    return CameraSourceConfig(
        config.camera_id,
        source,
        sample_fps=settings.sample_fps,
        queue_size=config.queue_size,
        change=change,
        jpeg_quality=config.jpeg_quality,
        backoff_initial_s=config.backoff_initial_s,
        backoff_max_s=config.backoff_max_s,
        open_timeout_s=config.open_timeout_s,
        read_timeout_s=config.read_timeout_s,
    )
