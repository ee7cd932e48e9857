"""META, the log's self-checking identity file: log id, trim point and the persisted LSN marks.

Owns: the file ``META`` (replaced whole and durably, with a CRC: docs/storage.md, "On-disk format")
and the values it holds (``log_format.MetaValues``). Two threads write it (the log's admin executor
for trims and recovery, the writer thread for LSN reservations), so each write holds the lock and
writes every value as it is then.

Invariant: the META on disk is whole and passes its CRC, and its ``lsn_limit`` is above every LSN
any segment file holds or ever held: the writer thread calls ``reserve`` for a group's last LSN
before it writes the group. Recovery that finds committed data damaged raises ``lsn_floor`` to
``lsn_limit`` (``raise_floor``) before it cuts anything, so no LSN that was ever durable is assigned
again, however often the log is reopened.
"""

from __future__ import annotations

import dataclasses
import os
import threading

from gateway.storage.durable_files import replace_durably
from gateway.storage.filelayer import FileLayer
from gateway.storage.interface import LogFailed
from gateway.storage.log_format import META_FILE, MetaValues, decode_meta, encode_meta

# LSNs reserved per META write: one write per this many records (a few per minute at full speed);
# also the most LSNs a corruption found at recovery can skip.
LSN_RESERVE = 1 << 20


class MetaFile:
    def __init__(self, layer: FileLayer, directory: str) -> None:
        self._layer = layer
        self._directory = directory
        self._lock = threading.Lock()
        self.values = MetaValues("")

    def load(self, new_log_id: str) -> None:
        """Read META, or create it for a new log named ``new_log_id``. LogFailed if it exists but is
        damaged (the log id cannot be guessed)."""
        data = self._layer.read_file(os.path.join(self._directory, META_FILE))
        if data is None:
            with self._lock:
                self._write(MetaValues(new_log_id))
            return
        decoded = decode_meta(data)
        if decoded is None:
            raise LogFailed(f"{self._directory}/{META_FILE} is damaged; refusing to guess the log id")
        self.values = decoded

    def set_trimmed(self, trimmed_lsn: int) -> None:
        with self._lock:
            self._write(dataclasses.replace(self.values, trimmed_lsn=trimmed_lsn))

    def reserve(self, last_lsn: int) -> None:
        """Make ``lsn_limit`` > ``last_lsn`` durable (no write when it already is)."""
        with self._lock:
            if last_lsn >= self.values.lsn_limit:
                self._write(dataclasses.replace(self.values, lsn_limit=last_lsn + 1 + LSN_RESERVE))

    def raise_floor(self) -> None:
        """Committed data was found damaged: no LSN below ``lsn_limit`` is assigned again."""
        with self._lock:
            if self.values.lsn_floor < self.values.lsn_limit:
                self._write(dataclasses.replace(self.values, lsn_floor=self.values.lsn_limit))

    def _write(self, values: MetaValues) -> None:
        """Replace META with ``values`` (the lock is held); they are current once durable."""
        replace_durably(self._layer, self._directory, META_FILE, encode_meta(values))
        self.values = values
