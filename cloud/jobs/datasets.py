"""Training sets built from what gateways uploaded, written as the tensor file a job trains on.

``python -m cloud.jobs.datasets --kind K --data-dir D --out W [--gateway G ...] [--min-rows N]``
reads the committed records of a running cloudd's store (read-only: safe while cloudd writes) and
writes ``W/dataset.pt`` (``cloud.training.run``'s ``tensor_file``) and ``W/lineage.json``. The job
manager runs it as a separate process before ``torchrun`` so that cloudd never imports torch.

``sensor_windows`` (the anomaly autoencoder; ``{"x": (N, WINDOW*CHANNELS)}``, trained with y = x):
``models.anomaly.WINDOW`` consecutive telemetry readings of one device (ordered by the device's own
``seq``), with every channel present and status ``ok``; windows overlap by half.

``camera_frames`` (the scene CNN; ``{"x": (N, 3, S, S), "y": (N,)}``): each classification event a
gateway's camera logged whose frame (JPEG) was uploaded as a committed blob, preprocessed as the
gateway preprocesses frames, labelled with the event's label (the gateway model's own verdict:
retraining on it distils the gateway's model, and a label set by hand would go the same way).

Invariant: the lineage lists exactly the (gateway, log_id) LSN ranges of the records whose data is
in the tensor file, so a model version can be traced to the uploads it learned.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from protocol.telemetry import READING_NAMES

STRIDE_FRACTION = 2  # windows start every WINDOW // STRIDE_FRACTION readings


def lsn_runs(lsns: Iterable[int]) -> list[list[int]]:
    """Sorted LSNs -> inclusive [first, last] runs."""
    runs: list[list[int]] = []
    for lsn in sorted(set(lsns)):
        if runs and lsn == runs[-1][1] + 1:
            runs[-1][1] = lsn
        else:
            runs.append([lsn, lsn])
    return runs


def windows_from_records(
    records: Iterable[Any], window: int, gateways: set[str] | None = None
) -> tuple[np.ndarray, dict[str, Any]]:
    """(raw windows (N, window, channels), lineage) from StoredRecord-like values (pure)."""
    series: dict[tuple[str, str], list[tuple[int, tuple[float, ...], str, int]]] = defaultdict(list)
    for stored in records:
        if gateways and stored.gateway not in gateways:
            continue
        record = stored.record
        body = record.get("body", {})
        readings = body.get("readings") or {}
        if record.get("kind") != "telemetry" or body.get("status", "ok") != "ok":
            continue
        values = [readings.get(name) for name in READING_NAMES]
        numbers = tuple(float(v) for v in values if isinstance(v, int | float))
        if len(numbers) < len(values):  # a channel is missing or not a number
            continue
        series[(stored.gateway, record["device"])].append(
            (int(body.get("seq", stored.lsn)), numbers, stored.log_id, stored.lsn)
        )
    rows, used = [], defaultdict(set)
    stride = max(1, window // STRIDE_FRACTION)
    for (gateway, _device), samples in sorted(series.items()):
        samples.sort()
        for start in range(0, len(samples) - window + 1, stride):
            chunk = samples[start : start + window]
            rows.append([values for _, values, _, _ in chunk])
            for _, _, log_id, lsn in chunk:
                used[(gateway, log_id)].add(lsn)
    sources: dict[str, dict[str, list[list[int]]]] = defaultdict(dict)
    for (gateway, log_id), lsns in sorted(used.items()):
        sources[gateway][log_id] = lsn_runs(lsns)
    lineage = {
        "dataset": "sensor_windows",
        "windows": len(rows),
        "records": sum(len(v) for v in used.values()),
        "sources": dict(sources),
    }
    shape = (len(rows), window, len(READING_NAMES))
    return np.asarray(rows, dtype=np.float32).reshape(shape), lineage


@dataclass(frozen=True)
class LabelledFrame:
    gateway: str
    blob_id: str
    label: int  # index into the label list


def frames_from_records(
    records: Iterable[Any],
    labels: list[str],
    blob_exists: Callable[[str, str], bool],
    gateways: set[str] | None = None,
) -> tuple[list[LabelledFrame], dict[str, Any]]:
    """(frames, lineage) from StoredRecord-like values (pure but for ``blob_exists``): classification
    events with a known label whose frame blob is committed; the others are counted in the lineage."""
    frames, used, missing = [], defaultdict(list), 0
    for stored in records:
        if gateways and stored.gateway not in gateways:
            continue
        body = stored.record.get("body", {})
        blob = body.get("blob")
        if (
            stored.record.get("kind") != "event"
            or body.get("type") != "classification"
            or not isinstance(blob, dict)
            or body.get("label") not in labels
        ):
            continue
        if not blob_exists(stored.gateway, str(blob.get("id"))):
            missing += 1  # spooled on the gateway, not (yet) committed here
            continue
        frames.append(LabelledFrame(stored.gateway, str(blob["id"]), labels.index(body["label"])))
        used[(stored.gateway, stored.log_id)].append(stored.lsn)
    sources: dict[str, dict[str, list[list[int]]]] = defaultdict(dict)
    for (gateway, log_id), lsns in sorted(used.items()):
        sources[gateway][log_id] = lsn_runs(lsns)
    counts = Counter(labels[f.label] for f in frames)
    lineage = {
        "dataset": "camera_frames",
        "frames": len(frames),
        "records": len(frames),
        "frames_not_uploaded": missing,
        "labels": dict(sorted(counts.items())),
        "sources": dict(sources),
    }
    return frames, lineage


def _enough(rows: int, kind: str, min_rows: int) -> None:
    if rows < min_rows:
        raise ValueError(f"only {rows} {kind} rows in the uploaded data (the job needs {min_rows})")


def build_sensor_windows(
    store: Any, gateways: set[str] | None, min_rows: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch

    from models.anomaly import WINDOW, normalise_window

    raw, lineage = windows_from_records(store.iter_records(), WINDOW, gateways)
    _enough(len(raw), "sensor_windows", min_rows)
    return {"x": torch.from_numpy(np.stack([normalise_window(w) for w in raw]))}, lineage


def build_camera_frames(
    store: Any, gateways: set[str] | None, min_rows: int, blob_root: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    import cv2
    import torch

    from models.artifact import preprocess_images
    from models.scene import INPUT_SPEC, LABELS
    from protocol.events import InputSpec

    def path(gateway: str, blob_id: str) -> Path:
        return blob_root / gateway / blob_id

    frames, lineage = frames_from_records(
        store.iter_records(), list(LABELS), lambda gw, blob: path(gw, blob).is_file(), gateways
    )
    _enough(len(frames), "camera_frames", min_rows)
    decoded = [
        cv2.imdecode(np.frombuffer(path(f.gateway, f.blob_id).read_bytes(), np.uint8), cv2.IMREAD_COLOR)
        for f in frames
    ]
    images = [image for image in decoded if image is not None]
    if len(images) < len(decoded):
        raise ValueError("a committed frame blob is not a JPEG OpenCV can decode")
    x = preprocess_images(images, InputSpec.model_validate(INPUT_SPEC))
    y = torch.tensor([f.label for f in frames], dtype=torch.int64)
    return {"x": torch.from_numpy(x), "y": y}, lineage


def main(argv: list[str] | None = None) -> int:
    import torch

    from cloud.jobs.spec import UPLOADED_DATASETS
    from cloud.store import DatasetStore

    parser = argparse.ArgumentParser(description="build a training set from a cloudd store")
    parser.add_argument("--kind", choices=list(UPLOADED_DATASETS), required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gateway", action="append", default=[])
    parser.add_argument("--min-rows", type=int, default=8)
    args = parser.parse_args(argv)
    gateways = set(args.gateway) or None
    store = DatasetStore.open(args.data_dir, readonly=True)
    try:
        if args.kind == "sensor_windows":
            tensors, lineage = build_sensor_windows(store, gateways, args.min_rows)
        else:
            tensors, lineage = build_camera_frames(store, gateways, args.min_rows, args.data_dir / "blobs")
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 1
    finally:
        store.close()
    rows = len(tensors["x"])
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(tensors, args.out / "dataset.pt")
    (args.out / "lineage.json").write_text(json.dumps(lineage))
    print(f"{rows} {args.kind} rows from {lineage['records']} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
