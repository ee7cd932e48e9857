"""The file operations the epoch log does, behind one small interface so tests can watch or break them.

Owns: ``OsFileLayer`` (the real thing: os.pwrite/os.fsync/...), ``RecordingFileLayer`` (passes
through and keeps a trace of every write and sync, from which tests build power-loss crash
states) and ``FaultyFileLayer`` (injects the faults one cannot cause for real here: a failing
fsync, ENOSPC after a byte quota).

Invariant: every byte the log puts on disk and every sync it relies on goes through one of these
methods, so a trace of them is a complete account of what a power cut could keep or lose.
"""

from __future__ import annotations

import errno
import os
import threading
from dataclasses import dataclass
from typing import Protocol

import runtime.files


class FileLayer(Protocol):
    def open(self, path: str, create: bool = False) -> int: ...
    def close(self, fd: int) -> None: ...
    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int: ...
    def pwritev(self, fd: int, buffers: list[bytes], offset: int) -> int: ...
    def pread(self, fd: int, size: int, offset: int) -> bytes: ...
    def fsync(self, fd: int) -> None: ...
    def fsync_dir(self, path: str) -> None: ...
    def truncate(self, fd: int, size: int) -> None: ...
    def size(self, fd: int) -> int: ...
    def listdir(self, path: str) -> list[str]: ...
    def makedirs(self, path: str) -> None: ...
    def unlink(self, path: str) -> None: ...
    def replace(self, src: str, dst: str) -> None: ...
    def read_file(self, path: str) -> bytes | None: ...


class OsFileLayer:
    """Plain POSIX calls. ``sync=False`` skips fsyncs (the benchmark's no-durability ceiling)."""

    def __init__(self, sync: bool = True) -> None:
        self.sync = sync

    def open(self, path: str, create: bool = False) -> int:
        return os.open(path, os.O_RDWR | (os.O_CREAT if create else 0) | getattr(os, "O_CLOEXEC", 0), 0o644)

    def close(self, fd: int) -> None:
        os.close(fd)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def pwritev(self, fd: int, buffers: list[bytes], offset: int) -> int:
        """One gathered write (at most IOV_MAX buffers): no join, no copy in Python, GIL released."""
        return os.pwritev(fd, buffers, offset)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return os.pread(fd, size, offset)

    def fsync(self, fd: int) -> None:
        if self.sync:
            os.fsync(fd)

    def fsync_dir(self, path: str) -> None:
        if self.sync:
            runtime.files.fsync_dir(path)

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def read_file(self, path: str) -> bytes | None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None


@dataclass(frozen=True)
class Op:
    """One traced operation. kind: create, write, fsync, fsync_dir, truncate, unlink, replace, mark."""

    kind: str
    path: str
    offset: int = 0
    data: bytes = b""
    other: str = ""  # replace: the destination; mark: the tag


class RecordingFileLayer:
    """Passes every call to ``inner`` and appends it to ``trace`` (thread-safe, in call order)."""

    def __init__(self, inner: FileLayer | None = None) -> None:
        self.inner: FileLayer = inner or OsFileLayer()
        self.trace: list[Op] = []
        self._paths: dict[int, str] = {}
        self._lock = threading.Lock()

    def _add(self, op: Op) -> None:
        with self._lock:
            self.trace.append(op)

    def mark(self, tag: str, value: int) -> None:
        """A test's own event (e.g. 'durable' up to an LSN) at its place in the trace."""
        self._add(Op("mark", "", value, b"", tag))

    def open(self, path: str, create: bool = False) -> int:
        existed = os.path.exists(path)
        fd = self.inner.open(path, create)
        self._paths[fd] = path
        if create and not existed:
            self._add(Op("create", path))
        return fd

    def close(self, fd: int) -> None:
        self._paths.pop(fd, None)
        self.inner.close(fd)

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        written = self.inner.pwrite(fd, data, offset)
        self._add(Op("write", self._paths[fd], offset, bytes(data[:written])))
        return written

    def pwritev(self, fd: int, buffers: list[bytes], offset: int) -> int:
        written = self.inner.pwritev(fd, buffers, offset)
        self._add(Op("write", self._paths[fd], offset, b"".join(buffers)[:written]))
        return written

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        return self.inner.pread(fd, size, offset)

    # An fsync is traced when it is called, not when it returns: it covers exactly the writes that had
    # completed by then. A write that another thread finishes while the fsync runs is traced after it,
    # so crash states may lose it (as a real disk may): the log must not rely on it until a later sync.
    def fsync(self, fd: int) -> None:
        self._add(Op("fsync", self._paths[fd]))
        self.inner.fsync(fd)

    def fsync_dir(self, path: str) -> None:
        self._add(Op("fsync_dir", path))
        self.inner.fsync_dir(path)

    def truncate(self, fd: int, size: int) -> None:
        self.inner.truncate(fd, size)
        self._add(Op("truncate", self._paths[fd], size))

    def size(self, fd: int) -> int:
        return self.inner.size(fd)

    def listdir(self, path: str) -> list[str]:
        return self.inner.listdir(path)

    def makedirs(self, path: str) -> None:
        self.inner.makedirs(path)

    def unlink(self, path: str) -> None:
        self.inner.unlink(path)
        self._add(Op("unlink", path))

    def replace(self, src: str, dst: str) -> None:
        self.inner.replace(src, dst)
        self._add(Op("replace", src, other=dst))

    def read_file(self, path: str) -> bytes | None:
        return self.inner.read_file(path)


class FaultyFileLayer(OsFileLayer):
    """Real files, plus injected faults: fsync fails (``fsync_errno``, EIO by default) from the Nth
    call, of files whose path contains ``fail_fsync_matching`` (default: any); writes beyond a byte
    quota fail with ENOSPC until ``free()`` raises the quota. Only for faults that cannot be real here."""

    def __init__(
        self, fail_fsync_from: int | None = None, write_quota: int | None = None, fsync_errno: int = errno.EIO
    ) -> None:
        super().__init__()
        self.fail_fsync_from = fail_fsync_from
        self.fail_fsync_matching = ""
        self.fsync_errno = fsync_errno
        self.write_quota = write_quota
        self.fsyncs = 0
        self.written = 0
        self.enospc = 0
        self._lock = threading.Lock()
        self._paths: dict[int, str] = {}

    def open(self, path: str, create: bool = False) -> int:
        fd = super().open(path, create)
        self._paths[fd] = path
        return fd

    def free(self, extra_bytes: int) -> None:
        with self._lock:
            if self.write_quota is not None:
                self.write_quota += extra_bytes

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        with self._lock:
            if self.write_quota is not None and self.written + len(data) > self.write_quota:
                self.enospc += 1
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.written += len(data)
        return super().pwrite(fd, data, offset)

    def pwritev(self, fd: int, buffers: list[bytes], offset: int) -> int:
        size = sum(map(len, buffers))
        with self._lock:
            if self.write_quota is not None and self.written + size > self.write_quota:
                self.enospc += 1
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.written += size
        return super().pwritev(fd, buffers, offset)

    def fsync(self, fd: int) -> None:
        with self._lock:
            self.fsyncs += 1
            failing = self.fail_fsync_from is not None and self.fsyncs >= self.fail_fsync_from
            failing = failing and self.fail_fsync_matching in self._paths.get(fd, "")
        if failing:
            raise OSError(self.fsync_errno, os.strerror(self.fsync_errno))
        super().fsync(fd)
