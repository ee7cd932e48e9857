"""Datasets users upload to cloudd (``cloudctl datasets upload NAME FILE``), for jobs that name
``dataset = "upload:NAME"``.

A dataset lives in ``<data_dir>/uploads/<name>/`` as ``data.npz`` or ``data.pt`` beside
``meta.json`` (its name, format, sha256, size, rows, shapes and dtypes). An ``.npz`` is checked
here with numpy (``allow_pickle=False``: a file never runs code in cloudd): arrays ``x`` (float,
at least 2-D, one row per sample) and optionally ``y`` (integer class indices of shape (N,) or
float targets with N rows), nothing else, every value finite. A torch tensor file
(``torch.save({"x": ..., "y": ...})``) is a zip that cloudd cannot read without torch: cloudd
checks it is one, and the job's prepare step (``cloud.jobs.prepare``, with torch) checks the
tensors the same way before the trainer starts.

Invariant: a dataset folder with a ``meta.json`` is complete and valid (the data file is written
and fsynced first, ``meta.json`` last, atomically); a name is never rebound to other bytes
(``store`` answers ``Exists`` for a different sha256, and the same bytes again are a no-op).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from runtime.files import atomic_write, fsync_dir

DatasetFormat = Literal["npz", "torch"]
DATA_FILES: dict[DatasetFormat, str] = {"npz": "data.npz", "torch": "data.pt"}
ARRAYS = ("x", "y")


class DatasetInvalid(ValueError):
    """The file is not a dataset cloudd can train on; the message says what is wrong."""


@dataclass(frozen=True)
class Exists:
    """The name is taken by other bytes."""

    meta: dict[str, Any]


def detect_format(path: Path) -> DatasetFormat:
    """An ``.npz`` holds ``x.npy``; a torch file holds ``<archive>/data.pkl``; both are zips."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise DatasetInvalid(
            f"file: neither an .npz nor a torch tensor file (not a zip archive: {exc})"
        ) from None
    if any(name.endswith(".npy") for name in names):
        return "npz"
    if any(name.endswith("/data.pkl") for name in names):
        return "torch"
    raise DatasetInvalid("file: a zip archive, but neither an .npz (x.npy) nor a torch file (data.pkl)")


def check_arrays(x: np.ndarray, y: np.ndarray | None) -> dict[str, Any]:
    """The shape facts of a valid dataset (pure); ``DatasetInvalid`` names the array at fault."""
    if x.dtype.kind != "f":
        raise DatasetInvalid(f"x: dtype {x.dtype} is not floating point (use float32)")
    if x.ndim < 2 or len(x) == 0:
        raise DatasetInvalid(f"x: shape {x.shape} must be (N, features...) with N >= 1")
    if not np.isfinite(x).all():
        raise DatasetInvalid("x: holds NaN or infinite values")
    facts: dict[str, Any] = {"rows": len(x), "x_shape": list(x.shape), "x_dtype": str(x.dtype)}
    if y is None:
        return {**facts, "y_shape": None, "y_dtype": None, "classes": None}
    if len(y) != len(x) or y.ndim == 0:
        raise DatasetInvalid(f"y: {y.shape} must have one row per row of x ({len(x)})")
    if y.dtype.kind in "iu":
        if y.ndim != 1 or y.min() < 0:
            raise DatasetInvalid(f"y: integer labels must be class indices >= 0 of shape (N,), not {y.shape}")
        classes = int(y.max()) + 1
    elif y.dtype.kind == "f":
        if not np.isfinite(y).all():
            raise DatasetInvalid("y: holds NaN or infinite values")
        classes = None
    else:
        raise DatasetInvalid(f"y: dtype {y.dtype} is neither integer (classes) nor floating point (targets)")
    return {**facts, "y_shape": list(y.shape), "y_dtype": str(y.dtype), "classes": classes}


def check_npz(path: Path) -> dict[str, Any]:
    try:
        with np.load(path, allow_pickle=False) as arrays:
            extra = sorted(set(arrays.files) - set(ARRAYS))
            if extra:
                raise DatasetInvalid(f"file: unexpected arrays {extra} (an .npz holds x and optionally y)")
            if "x" not in arrays.files:
                raise DatasetInvalid("x: the .npz has no array x")
            return check_arrays(arrays["x"], arrays["y"] if "y" in arrays.files else None)
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as exc:
        if isinstance(exc, DatasetInvalid):
            raise
        raise DatasetInvalid(f"file: not a readable .npz ({exc})") from None


def fits_loss(meta: dict[str, Any], loss: str, min_rows: int) -> str | None:
    """Why a dataset cannot train with ``loss`` (None when it can, or when only the job can tell)."""
    if meta["rows"] is None:  # a torch file: checked by the job's prepare step
        return None
    if meta["rows"] < min_rows:
        return f"{meta['rows']} rows; batch_size needs at least {min_rows} after the held-out share"
    y_kind = None if meta["y_dtype"] is None else np.dtype(meta["y_dtype"]).kind
    if loss == "cross_entropy" and y_kind not in ("i", "u"):
        return "loss cross_entropy needs y as integer class indices"
    if loss == "mse" and y_kind != "f":
        return "loss mse needs y as float targets"
    return None


class UploadedDatasets:
    """The folder of uploaded datasets. ``store`` runs one at a time (cloud.api.uploads holds a lock
    around it and runs it in a worker thread); reads may run beside it (``meta.json`` comes last)."""

    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root, self.max_bytes = root, max_bytes
        self.incoming = root / ".incoming"

    def meta(self, name: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.root / name / "meta.json").read_text())
        except FileNotFoundError:
            return None

    def exists(self, name: str) -> bool:
        return (self.root / name / "meta.json").is_file()

    def data_file(self, name: str) -> Path:
        meta = self.meta(name)
        if meta is None:
            raise KeyError(name)
        return self.root / name / DATA_FILES[meta["format"]]

    def list(self) -> list[dict[str, Any]]:
        if not self.root.is_dir():
            return []
        metas = (self.meta(p.name) for p in sorted(self.root.iterdir()) if not p.name.startswith("."))
        return [m for m in metas if m is not None]

    def temp_path(self) -> Path:
        """A fresh file under ``.incoming`` for an upload in progress (leftovers: removed on start)."""
        self.incoming.mkdir(parents=True, exist_ok=True)
        return self.incoming / f"{os.getpid()}-{time.monotonic_ns()}"

    def clear_incoming(self) -> None:
        shutil.rmtree(self.incoming, ignore_errors=True)

    def store(self, name: str, upload: Path, now: float) -> tuple[int, dict[str, Any] | Exists]:
        """Validate ``upload`` (a complete file) and keep it as ``name``: (201, meta) stored,
        (200, meta) the same bytes were there, (409, Exists) other bytes are. Raises
        ``DatasetInvalid``. ``upload`` is moved or removed."""
        try:
            sha = _sha256(upload)
            existing = self.meta(name)
            if existing is not None:
                return (200, existing) if existing["sha256"] == sha else (409, Exists(existing))
            fmt = detect_format(upload)
            facts = (
                check_npz(upload)
                if fmt == "npz"
                else dict.fromkeys(("rows", "x_shape", "x_dtype", "y_shape", "y_dtype", "classes"))
            )
            meta = {
                "name": name,
                "format": fmt,
                "sha256": sha,
                "size": upload.stat().st_size,
                "uploaded_ts": now,
                **facts,
            }
            folder = self.root / name
            folder.mkdir(parents=True, exist_ok=True)
            os.replace(upload, folder / DATA_FILES[fmt])
            fsync_dir(folder)
            atomic_write(folder / "meta.json", json.dumps(meta).encode())
            return 201, meta
        finally:
            upload.unlink(missing_ok=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
