"""Simulate a camera: a synthetic scene served as MJPEG over HTTP and/or written to a video file.

``devicesim camera --port 8081 --truth truth.jsonl`` serves ``http://127.0.0.1:8081/stream.mjpg``
(multipart/x-mixed-replace, one JPEG per part) in real time at ``--fps``; ``--out scene.avi``
writes the same frames to an MJPG AVI (as fast as it can when no port is given). Every produced
frame gets one ground-truth JSON line: frame index, unix timestamp, dominant label, objects+bboxes.
``--hold`` serves the scene's first frame as a still (no ground truth) until the process gets SIGUSR1,
then plays the scene from its start: so that runs whose watchers took different times to start see
the same scene at the same time after the signal (tests/harness/live_trace.py plays its trace so).

Invariant: each frame index is produced once, in order, and its ground-truth line is written and
flushed before the frame is offered to any client or to the file.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO

from devices.flags import PORT, integer, number

BOUNDARY = "edgefedframe"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=integer(), default=0)
    parser.add_argument("--width", type=integer(32, 4096), default=320, help="pixels, 32 to 4096")
    parser.add_argument("--height", type=integer(32, 4096), default=240, help="pixels, 32 to 4096")
    # at least 1: the scene is planned in whole frames, and below one frame per second a segment has none
    parser.add_argument("--fps", type=number(1, 120), default=10.0, help="frames per second, 1 to 120")
    parser.add_argument("--frames", type=integer(0), default=0, help="frames to produce (0: until stopped)")
    parser.add_argument("--noise", type=number(0, 255), default=3.0, help="sensor noise sigma (grey levels)")
    parser.add_argument(
        "--brightness",
        type=number(0.1, 2),
        default=1.0,
        help="scale of the scene's light, 0.1 to 2 (0.5: a dim site the factory scene model never saw)",
    )
    parser.add_argument(
        "--scene-speed",
        type=number(0.1, 20),
        default=1.0,
        help="the scene plays this many times faster (objects come and go sooner), 0.1 to 20",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=PORT, default=None, help="serve MJPEG over HTTP on this port")
    parser.add_argument("--out", type=Path, default=None, help="write an MJPG .avi video file")
    parser.add_argument("--truth", type=Path, default=None, help="write ground truth as JSON lines")
    parser.add_argument("--jpeg-quality", type=integer(1, 100), default=85, help="1 to 100")
    parser.add_argument(
        "--hold",
        action="store_true",
        help="serve the first frame as a still until SIGUSR1, then play the scene (HTTP only)",
    )


class LatestFrame:
    """The newest encoded frame, for any number of HTTP clients; a slow client skips frames."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._index = -1
        self._jpeg = b""
        self.closed = False

    def publish(self, index: int, jpeg: bytes) -> None:
        with self._cond:
            self._index, self._jpeg = index, jpeg
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def wait_newer(self, seen: int, timeout: float) -> tuple[int, bytes] | None:
        with self._cond:
            self._cond.wait_for(lambda: self._index > seen or self.closed, timeout)
            if self._index <= seen or self.closed:
                return None
            return self._index, self._jpeg


def make_handler(latest: LatestFrame) -> type[BaseHTTPRequestHandler]:
    class MjpegHandler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_GET(self) -> None:
            if self.path not in ("/", "/stream.mjpg"):
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", f"multipart/x-mixed-replace; boundary={BOUNDARY}")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            seen = -1
            try:
                while not latest.closed:
                    item = latest.wait_newer(seen, timeout=1.0)
                    if item is None:
                        continue
                    seen, jpeg = item
                    self.wfile.write(
                        f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\n"
                        f"Content-Length: {len(jpeg)}\r\nX-Frame-Index: {seen}\r\n\r\n".encode()
                    )
                    self.wfile.write(jpeg)
                    self.wfile.write(b"\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client went away; that is its right

        def log_message(self, format: str, *args: object) -> None:
            pass

    return MjpegHandler


def produce(
    args: argparse.Namespace,
    latest: LatestFrame | None,
    truth: IO[str] | None,
    stop: threading.Event,
    play: threading.Event,
) -> int:
    """Render frames in order; pace them in real time only when someone watches over HTTP. Until
    ``play`` is set, serve frame 0 as a still (``--hold``)."""
    import cv2

    from models.synthetic_scene import SceneSynth

    total = args.frames if args.frames > 0 else 10**9
    synth = SceneSynth(
        seed=args.seed,
        width=args.width,
        height=args.height,
        fps=args.fps / args.scene_speed,  # the scene is planned in frames: fewer per second, sooner
        n_frames=min(total, 10**6),
        noise_sigma=args.noise,
        brightness=args.brightness,
    )
    writer = None
    if args.out is not None:
        writer = cv2.VideoWriter(
            str(args.out), cv2.VideoWriter.fourcc(*"MJPG"), args.fps, (args.width, args.height)
        )
        if not writer.isOpened():
            print(f"cannot open video writer for {args.out}", file=sys.stderr)
            return 1
    period = 1.0 / args.fps
    start = time.time()
    index = published = 0  # the scene's frame; the frames served, stills included
    still: bytes | None = None
    try:
        while latest is not None and not play.is_set():
            if still is None:
                encoded = cv2.imencode(".jpg", synth.frame(0), [cv2.IMWRITE_JPEG_QUALITY, args.jpeg_quality])
                still = encoded[1].tobytes()
            latest.publish(published, still)
            published += 1
            if stop.wait(period):
                return 0
        start = time.time()
        while index < total and not stop.is_set():
            if latest is not None:
                delay = start + index * period - time.time()
                if delay > 0 and stop.wait(delay):
                    break
            ts = time.time() if latest is not None else start + index * period
            image = synth.frame(index)
            if truth is not None:
                truth.write(json.dumps(synth.ground_truth(index, ts)) + "\n")
                truth.flush()
            if writer is not None:
                writer.write(image)
            if latest is not None:
                ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, args.jpeg_quality])
                latest.publish(published, jpeg.tobytes())
                published += 1
            index += 1
    finally:
        if writer is not None:
            writer.release()
    return 0


def run(args: argparse.Namespace) -> int:
    if args.port is None and args.out is None:
        print("give --port (serve MJPEG) and/or --out (write a video file)", file=sys.stderr)
        return 2
    stop, play = threading.Event(), threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: play.set())
    if not args.hold:
        play.set()
    truth = args.truth.open("w", encoding="utf-8") if args.truth else None
    latest = server = server_thread = None
    try:
        if args.port is not None:
            latest = LatestFrame()
            server = ThreadingHTTPServer((args.host, args.port), make_handler(latest))
            server.daemon_threads = True
            server_thread = threading.Thread(target=server.serve_forever, name="mjpeg-http", daemon=True)
            server_thread.start()
            print(f"serving MJPEG on http://{args.host}:{args.port}/stream.mjpg", flush=True)
        status = produce(args, latest, truth, stop, play)
        if latest is not None and args.frames > 0:
            stop.wait()  # a finite served scene stays up (last frame) until stopped
        return status
    finally:
        if latest is not None:
            latest.close()
        if server is not None:
            server.shutdown()
            server.server_close()
        if truth is not None:
            truth.close()
