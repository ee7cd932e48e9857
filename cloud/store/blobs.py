"""BlobStore: large blobs (camera frames, model updates) uploaded in chunks, resumable, committed atomically.

Layout under ``<data_dir>/blobs/<gateway>/``: ``<blob_id>`` is a committed blob, ``.partial/<blob_id>``
one being uploaded, ``.sha256/<blob_id>`` the committed blob's hex SHA-256 (written, fsynced and
renamed into place *before* the blob itself is renamed, so every committed blob has its hash).

Invariants:
- A blob is committed iff ``<gateway>/<blob_id>`` exists, and then its bytes hash to its
  ``.sha256`` entry: commit verifies the hash of the whole partial file, fsyncs it, and renames it
  into place (then fsyncs the directory). A committed blob never changes; re-sending it is a no-op.
- A chunk is appended only at the partial file's current size (``offset`` must equal it), whole
  or not at all (the API reads the whole body first), and **fsynced before it is acknowledged**:
  an offset the server reported stays valid across a cloudd crash or power cut, so a client never
  resends below it. Why per chunk and not only at commit: the offset is what a client resumes from;
  with fsync at commit only, a crash could leave the partial shorter than an offset already
  reported (or with a zero-filled tail), and the client would have to restart from 0. Chunks are
  large (256 KiB by default), so one fsync per chunk is cheap next to the link that carried it.
- Damage a crash can still cause (a torn, unacknowledged chunk at the partial's tail) is caught by
  the hash at commit: the partial is discarded (``HashMismatch``) and the client starts again.

Blocking I/O; ``AsyncBlobStore`` runs it on its own small thread pool with a bound on queued calls.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from runtime.files import atomic_write, fsync_dir

BLOB_ID_PATTERN = r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}"  # never starts with "." (the store's own dirs)
SHA256_PATTERN = r"[0-9a-f]{64}"
MAX_BLOB_BYTES = 1 << 30
LOCK_STRIPES = 64
_BLOB_ID = re.compile(BLOB_ID_PATTERN)
_SHA = re.compile(SHA256_PATTERN)
T = TypeVar("T")


class BlobBusy(Exception):
    """Too many blob calls are queued; retry later."""


@dataclass(frozen=True)
class BlobStatus:
    blob_id: str
    offset: int  # bytes stored (for a committed blob: its size)
    committed: bool
    sha256: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"v": 1, **asdict(self)}


@dataclass(frozen=True)
class Appended:
    """The chunk is stored (fsynced); ``written`` = 0 for a replay of a committed blob."""

    status: BlobStatus
    written: int
    committed_now: bool = False


@dataclass(frozen=True)
class OffsetMismatch:
    """The chunk was not at the stored offset; nothing was written. Resume from ``status.offset``."""

    status: BlobStatus


@dataclass(frozen=True)
class HashMismatch:
    """The bytes do not hash to the claimed SHA-256; the partial was discarded (resume from 0)."""

    blob_id: str
    expected: str
    actual: str
    written: int = 0  # bytes of this request written (then discarded with the partial)


@dataclass(frozen=True)
class Conflict:
    """A committed blob with another hash already has this id; nothing changed."""

    status: BlobStatus


@dataclass(frozen=True)
class TooLarge:
    blob_id: str
    size: int


AppendResult = Appended | OffsetMismatch | HashMismatch | Conflict | TooLarge


def valid_blob_id(blob_id: str) -> bool:
    return _BLOB_ID.fullmatch(blob_id) is not None


def valid_sha256(value: str) -> bool:
    return _SHA.fullmatch(value) is not None


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


class BlobStore:
    """Blocking blob storage. Calls for one (gateway, blob) are serialised by a (striped) lock."""

    def __init__(self, root: Path | str, max_blob_bytes: int = MAX_BLOB_BYTES) -> None:
        self.root = Path(root)
        self.max_blob_bytes = max_blob_bytes
        self._locks = [threading.Lock() for _ in range(LOCK_STRIPES)]
        self.counters = {
            "chunks": 0,
            "bytes_written": 0,
            "committed": 0,
            "offset_mismatches": 0,
            "hash_mismatches": 0,
            "replays": 0,
        }

    # -- paths -----------------------------------------------------------------------------------
    def _dirs(self, gateway: str) -> tuple[Path, Path, Path]:
        base = self.root / gateway
        return base, base / ".partial", base / ".sha256"

    def _lock(self, gateway: str, blob_id: str) -> threading.Lock:
        # Striped: bounded memory however many blobs pass; two blobs rarely share a stripe.
        return self._locks[hash((gateway, blob_id)) % LOCK_STRIPES]

    def committed_path(self, gateway: str, blob_id: str) -> Path:
        return self.root / gateway / blob_id

    # -- operations ------------------------------------------------------------------------------
    def status(self, gateway: str, blob_id: str) -> BlobStatus:
        base, partial, hashes = self._dirs(gateway)
        done = base / blob_id
        if done.exists():
            return BlobStatus(blob_id, done.stat().st_size, True, (hashes / blob_id).read_text().strip())
        part = partial / blob_id
        return BlobStatus(blob_id, part.stat().st_size if part.exists() else 0, False)

    def append(
        self, gateway: str, blob_id: str, offset: int, chunk: bytes, final_sha256: str | None = None
    ) -> AppendResult:
        """Append ``chunk`` at ``offset``; with ``final_sha256``, then verify and commit."""
        with self._lock(gateway, blob_id):
            status = self.status(gateway, blob_id)
            if status.committed:
                return self._replay(status, offset, chunk, final_sha256)
            if offset != status.offset:
                self.counters["offset_mismatches"] += 1
                return OffsetMismatch(status)
            if offset + len(chunk) > self.max_blob_bytes:
                return TooLarge(blob_id, offset + len(chunk))
            base, partial, hashes = self._dirs(gateway)
            if chunk:
                self._write_chunk(partial, blob_id, offset, chunk)
            if final_sha256 is None:
                return Appended(BlobStatus(blob_id, offset + len(chunk), False), len(chunk))
            result = self._commit(base, partial, hashes, blob_id, final_sha256)
            if isinstance(result, HashMismatch):
                return HashMismatch(result.blob_id, result.expected, result.actual, len(chunk))
            return Appended(result, len(chunk), True)

    def _replay(self, status: BlobStatus, offset: int, chunk: bytes, sha: str | None) -> AppendResult:
        if sha is not None and sha != status.sha256:
            return Conflict(status)
        self.counters["replays"] += 1
        return Appended(status, 0)

    def _write_chunk(self, partial: Path, blob_id: str, offset: int, chunk: bytes) -> None:
        new = not partial.exists()
        partial.mkdir(parents=True, exist_ok=True)
        if new:
            fsync_dir(partial.parent)
        path = partial / blob_id
        created = not path.exists()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            written = 0
            while written < len(chunk):
                written += os.pwrite(fd, chunk[written:], offset + written)
            os.fsync(fd)  # acknowledged offsets survive a crash (module docstring)
        finally:
            os.close(fd)
        if created:
            fsync_dir(partial)
        self.counters["chunks"] += 1
        self.counters["bytes_written"] += len(chunk)

    def _commit(
        self, base: Path, partial: Path, hashes: Path, blob_id: str, sha: str
    ) -> BlobStatus | HashMismatch:
        part = partial / blob_id
        if not part.exists():  # an empty blob: nothing was ever appended
            partial.mkdir(parents=True, exist_ok=True)
            part.touch()
        actual = _hash_file(part)
        if actual != sha:
            part.unlink()
            self.counters["hash_mismatches"] += 1
            return HashMismatch(blob_id, sha, actual)
        hashes.mkdir(parents=True, exist_ok=True)
        atomic_write(hashes / blob_id, (sha + "\n").encode())  # durable before the blob is committed
        os.replace(part, base / blob_id)
        fsync_dir(base)
        self.counters["committed"] += 1
        return BlobStatus(blob_id, (base / blob_id).stat().st_size, True, sha)


class AsyncBlobStore:
    """Runs a ``BlobStore`` on its own thread pool (blob fsyncs never delay batch acknowledgements).

    At most ``max_pending`` calls are queued or running; one more raises ``BlobBusy`` at once.
    """

    def __init__(self, store: BlobStore, *, workers: int = 2, max_pending: int = 32) -> None:
        self.store = store
        self.max_pending = max_pending
        self.pending = 0
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="cloudd-blobs")

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self.pending >= self.max_pending:
            raise BlobBusy(f"{self.pending} blob calls pending (max {self.max_pending})")
        self.pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        finally:
            self.pending -= 1

    async def status(self, gateway: str, blob_id: str) -> BlobStatus:
        return await self._call(self.store.status, gateway, blob_id)

    async def append(
        self, gateway: str, blob_id: str, offset: int, chunk: bytes, final_sha256: str | None = None
    ) -> AppendResult:
        return await self._call(self.store.append, gateway, blob_id, offset, chunk, final_sha256)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
