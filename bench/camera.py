"""Camera path benchmark: frames/s of the whole gateway camera path (decode, change detection,
inference) versus onnxruntime alone on the same decoded frames; uploaded bytes with change
detection versus uploading every frame.

    python -m bench.camera [--quick]   -> bench/results/camera.json

Ratios: pipeline_vs_raw_inference = pipeline frames/s / raw-inference frames/s (higher is better);
bytes_vs_all_frames = bytes of every frame as JPEG / bytes the change-detected path uploads.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

from bench._common import Results
from gateway.camera.change import ChangeConfig
from gateway.camera.inference import InferenceEngine, feed_from_camera
from gateway.camera.source import CameraSource, CameraSourceConfig
from models.artifact import load_artifact
from models.inference import InferenceInput, build_inputs, load_and_probe
from models.synthetic_scene import SceneSynth

REPO = Path(__file__).resolve().parents[1]
JPEG_QUALITY = 80


def write_scene(path: Path, frames: int, fps: float, seed: int) -> None:
    synth = SceneSynth(seed=seed, fps=fps, n_frames=frames)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), fps, (synth.width, synth.height))
    for index in range(frames):
        writer.write(synth.frame(index))
    writer.release()


def decode_all(path: Path) -> list[np.ndarray]:
    capture = cv2.VideoCapture(str(path))
    frames = []
    while True:
        ok, image = capture.read()
        if not ok:
            break
        frames.append(image)
    capture.release()
    return frames


def raw_inference_fps(artifact, frames: list[np.ndarray]) -> float:
    """onnxruntime alone: preprocess + run, one frame at a time, on already decoded frames."""
    model = load_and_probe(artifact, threads=1)
    spec = artifact.metadata
    start = time.perf_counter()
    for index, image in enumerate(frames):
        inputs = build_inputs(artifact, [InferenceInput("bench", index, 0.0, image)])
        model.session.run([spec.output_name], {spec.input.name: inputs})
    return len(frames) / (time.perf_counter() - start)


async def pipeline(artifact, video: Path, change: bool) -> dict[str, float]:
    source = CameraSource(
        CameraSourceConfig(
            "bench",
            str(video),
            full_policy="block",
            queue_size=32,
            change=ChangeConfig(enabled=change),
            jpeg_quality=JPEG_QUALITY,
        )
    )
    engine = InferenceEngine(max_batch=8, queue_size=1024, results_size=100_000)
    assert (await engine.start(artifact)).ok
    start = time.perf_counter()
    await source.start()
    fed = await feed_from_camera(source, engine)
    await engine.stop(drain_timeout=120)
    elapsed = time.perf_counter() - start
    await source.stop()
    assert engine.counters.inferred == fed, engine.counters
    return {
        "fps": source.counters.frames_read / elapsed,
        "inferred": fed,
        "frames": source.counters.frames_read,
        "jpeg_bytes": source.counters.jpeg_bytes,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--artifact", type=Path, default=REPO / "models" / "artifacts" / "scene")
    args = parser.parse_args()
    frames_n = 300 if args.quick else 1800  # 30 s / 3 min of the default 10 fps scene
    artifact = load_artifact(args.artifact)
    with tempfile.TemporaryDirectory() as tmp:
        video = Path(tmp) / "scene.avi"
        write_scene(video, frames_n, 10.0, args.seed)
        frames = decode_all(video)
        raw_fps = raw_inference_fps(artifact, frames)
        ours = asyncio.run(pipeline(artifact, video, change=True))
        every = asyncio.run(pipeline(artifact, video, change=False))
    all_bytes = sum(len(cv2.imencode(".jpg", f, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])[1]) for f in frames)
    case = f"{frames_n} frames 320x240, seed {args.seed}"
    measured = [
        ("onnxruntime alone (decoded frames)", "frames_per_s", raw_fps),
        ("camera path, change detection", "frames_per_s", ours["fps"]),
        ("camera path, every frame", "frames_per_s", every["fps"]),
        ("camera path, change detection", "frames_inferred", ours["inferred"]),
        ("upload every frame", "upload_bytes", all_bytes),
        ("upload changed frames", "upload_bytes", ours["jpeg_bytes"]),
    ]
    results = Results("camera", args.quick)
    for system, metric, value in measured:
        results.add(case, system, metric, value)
    results.ratios["pipeline_vs_raw_inference"] = ours["fps"] / raw_fps
    results.ratios["bytes_vs_all_frames"] = all_bytes / max(1, ours["jpeg_bytes"])
    print(f"{'system':40} {'metric':16} {'value':>14}")
    for row in results.rows:
        print(f"{row['system']:40} {row['metric']:16} {row['value']:14.1f}")
    for name, value in results.ratios.items():
        print(f"{name:57} {value:14.2f}")
    results.write(table=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
