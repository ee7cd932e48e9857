"""Training sets built from what gateways uploaded: sensor windows for the anomaly model.

``python -m cloud.jobs.datasets --data-dir D --out W [--gateway G ...]`` reads the committed
records of a running cloudd's store (read-only: safe while cloudd writes), builds windows and
writes ``W/dataset.pt`` (``{"x": (N, WINDOW*CHANNELS) float32}``) and ``W/lineage.json``. The job
manager runs it as a separate process before ``torchrun`` so that cloudd never imports torch.

A window is ``models.anomaly.WINDOW`` consecutive telemetry readings of one device (ordered by the
device's own ``seq``), with every channel of ``models.anomaly`` present and status ``ok``; windows
overlap by half. Invariant: the lineage lists exactly the (gateway, log_id) LSN ranges of the
records that are inside some window, so a model version can be traced to the uploads it learned.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable
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


def windows_from_records(records: Iterable[Any], window: int, gateways: set[str] | None = None
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
        if any(not isinstance(v, int | float) for v in values):
            continue
        series[(stored.gateway, record["device"])].append(
            (int(body.get("seq", stored.lsn)), tuple(float(v) for v in values), stored.log_id, stored.lsn))
    rows, used = [], defaultdict(set)
    stride = max(1, window // STRIDE_FRACTION)
    for (gateway, _device), samples in sorted(series.items()):
        samples.sort()
        for start in range(0, len(samples) - window + 1, stride):
            chunk = samples[start:start + window]
            rows.append([values for _, values, _, _ in chunk])
            for _, _, log_id, lsn in chunk:
                used[(gateway, log_id)].add(lsn)
    sources: dict[str, dict[str, list[list[int]]]] = defaultdict(dict)
    for (gateway, log_id), lsns in sorted(used.items()):
        sources[gateway][log_id] = lsn_runs(lsns)
    lineage = {"dataset": "sensor_windows", "windows": len(rows),
               "records": sum(len(v) for v in used.values()), "sources": dict(sources)}
    shape = (len(rows), window, len(READING_NAMES))
    return np.asarray(rows, dtype=np.float32).reshape(shape), lineage


def main(argv: list[str] | None = None) -> int:
    import torch

    from cloud.store import DatasetStore
    from models.anomaly import WINDOW, normalise_window

    parser = argparse.ArgumentParser(description="build sensor windows from a cloudd store")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gateway", action="append", default=[])
    parser.add_argument("--min-windows", type=int, default=8)
    args = parser.parse_args(argv)
    store = DatasetStore.open(args.data_dir, readonly=True)
    try:
        raw, lineage = windows_from_records(store.iter_records(), WINDOW, set(args.gateway) or None)
    finally:
        store.close()
    if len(raw) < args.min_windows:
        print(f"only {len(raw)} sensor windows in the uploaded data (need {args.min_windows})",
              file=sys.stderr)
        return 1
    x = torch.from_numpy(np.stack([normalise_window(w) for w in raw]))
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save({"x": x}, args.out / "dataset.pt")
    (args.out / "lineage.json").write_text(json.dumps(lineage))
    print(f"{len(x)} windows from {lineage['records']} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
