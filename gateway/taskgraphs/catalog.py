"""The predefined services: sensor, camera and training task graphs.

Invariant: every graph here is a valid ``TaskGraph`` whose source is pinned to the edge and whose
last task, ``upload``, is the delivery of results into the cloud (pinned there, zero cost): a
service's latency is the time from an input to its result, produced at the edge or in the cloud;
delivering edge results is store-and-forward, bounded by the uplink, not by the target.

Edge costs are defaults for a Raspberry-Pi-class gateway (one core); call
``gateway.taskgraphs.profile.with_profiled_costs`` to replace them with costs measured on this box.
Cloud costs are declared. Sizes: a sensor sample is ~200 bytes of JSON, a camera frame a 150 kB
JPEG; a farm scene changes rarely, so change detection passes ``changed_fraction`` of frames.
"""

from __future__ import annotations

from gateway.taskgraphs.graph import Task, TaskGraph


def sensor_graph(
    rate_hz: float = 10.0, window: int = 10, target_s: float = 1.0, priority: int = 3
) -> TaskGraph:
    return TaskGraph(
        name="sensor",
        latency_target_s=target_s,
        priority=priority,
        rate_hz=rate_hz,
        tasks=(
            Task("ingest", edge_cost_s=0.0002, cloud_cost_s=0.0001, output_bytes=200, raw=True),
            Task(
                "aggregate",
                edge_cost_s=0.001,
                cloud_cost_s=0.0002,
                output_bytes=240,
                selectivity=1.0 / window,
                after=("ingest",),
            ),
            Task("detect", edge_cost_s=0.004, cloud_cost_s=0.0005, output_bytes=64, after=("aggregate",)),
            Task(
                "upload",
                edge_cost_s=0.0,
                cloud_cost_s=0.0,
                output_bytes=0,
                after=("detect",),
                pin="cloud",
                delivery=True,
            ),
        ),
    )


def camera_graph(
    fps: float = 1.0,
    changed_fraction: float = 0.1,
    target_s: float = 2.0,
    priority: int = 2,
    frame_bytes: int = 150_000,
    cloud_infer_s: float = 0.03,
) -> TaskGraph:
    return TaskGraph(
        name="camera",
        latency_target_s=target_s,
        priority=priority,
        rate_hz=fps,
        tasks=(
            # frames cross as blobs: a PUT, then the record that references it (two round trips)
            Task(
                "capture", edge_cost_s=0.003, cloud_cost_s=0.003, output_bytes=frame_bytes, raw=True, trips=2
            ),
            Task(
                "change",
                edge_cost_s=0.02,
                cloud_cost_s=0.003,
                output_bytes=frame_bytes,
                selectivity=changed_fraction,
                after=("capture",),
                raw=True,
                trips=2,
            ),
            Task(
                "infer", edge_cost_s=0.45, cloud_cost_s=cloud_infer_s, output_bytes=2_000, after=("change",)
            ),
            Task("summarise", edge_cost_s=0.005, cloud_cost_s=0.001, output_bytes=400, after=("infer",)),
            Task(
                "upload",
                edge_cost_s=0.0,
                cloud_cost_s=0.0,
                output_bytes=0,
                after=("summarise",),
                pin="cloud",
                delivery=True,
            ),
        ),
    )


def vibration_graph(
    window_s: float = 2.0, target_s: float = 1.5, priority: int = 2, cloud_classify_s: float = 0.015
) -> TaskGraph:
    """A machine-health classifier on a vibration/audio channel (16 kHz, 16-bit, 2 s windows).

    capture -> spectrogram -> classify (a small CNN: ~0.6 s on one Raspberry-Pi-class core, ~15 ms
    on a cloud GPU) -> summarise -> upload. Its best side flips with the link: on a fast link the
    spectrogram goes up, on a slow or absent one it runs here.

    Sizes: raw audio is 16 kHz x 16 bit = 32 kB/s (64 kB per 2 s window). The spectrogram is 128
    log-mel bands x 63 frames (n_fft 1024, hop 512: 2 s / 32 ms) quantised to 8 bits, the input a
    quantised CNN takes (log-mel in dB spans ~80 dB: 0.3 dB steps) = 8 kB, an 8x reduction. (It was
    declared as 32 kB, float32 with 64 frames: half the raw audio, which no deployment would send.)
    """
    raw_bytes = int(16_000 * 2 * window_s)
    mel_bands, frames = 128, 1 + int(window_s * 16_000) // 512  # centred frames: 63 for 2 s
    return TaskGraph(
        name="vibration",
        latency_target_s=target_s,
        priority=priority,
        rate_hz=1.0 / window_s,
        tasks=(
            Task("capture", edge_cost_s=0.002, cloud_cost_s=0.002, output_bytes=raw_bytes, raw=True),
            Task(
                "spectrogram",
                edge_cost_s=0.04,
                cloud_cost_s=0.003,
                output_bytes=mel_bands * frames,
                after=("capture",),
            ),
            Task(
                "classify",
                edge_cost_s=0.6,
                cloud_cost_s=cloud_classify_s,
                output_bytes=200,
                after=("spectrogram",),
            ),
            Task("summarise", edge_cost_s=0.002, cloud_cost_s=0.001, output_bytes=300, after=("classify",)),
            Task(
                "upload",
                edge_cost_s=0.0,
                cloud_cost_s=0.0,
                output_bytes=0,
                after=("summarise",),
                pin="cloud",
                delivery=True,
            ),
        ),
    )


def training_graph(round_every_s: float = 120.0, target_s: float = 60.0, priority: int = 1) -> TaskGraph:
    """Local training on private data: only the (compressed) model update may leave the gateway."""
    return TaskGraph(
        name="training",
        latency_target_s=target_s,
        priority=priority,
        private=True,
        rate_hz=1.0 / round_every_s,
        tasks=(
            Task("collect", edge_cost_s=0.05, cloud_cost_s=0.01, output_bytes=2_000_000, raw=True),
            Task("train", edge_cost_s=8.0, cloud_cost_s=0.8, output_bytes=100_000, after=("collect",)),
            Task(
                "upload",
                edge_cost_s=0.0,
                cloud_cost_s=0.0,
                output_bytes=0,
                after=("train",),
                pin="cloud",
                delivery=True,
            ),
        ),
    )


def default_graphs() -> tuple[TaskGraph, ...]:
    return (sensor_graph(), camera_graph(), training_graph())
