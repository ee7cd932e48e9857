"""cloud.store: datasets (append-only segment files) and their metadata (SQLite).

See ``dataset.py`` for the crash-consistency and idempotency invariants.
"""

from cloud.store.dataset import DatasetStore, RecoveryReport, StoreCounts, StoredRecord, StoreLocked
from cloud.store.meta import DeviceCounts, GatewayCounts
from cloud.store.writer import AsyncStoreWriter, StoreBusy

__all__ = [
    "AsyncStoreWriter",
    "DatasetStore",
    "DeviceCounts",
    "GatewayCounts",
    "RecoveryReport",
    "StoreBusy",
    "StoreCounts",
    "StoreLocked",
    "StoredRecord",
]
