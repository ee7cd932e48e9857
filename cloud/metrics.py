"""CloudMetrics: cloudd's own Prometheus registry (never the global one, so tests can run many).

Invariant: every batch request ends in exactly one of ``batches`` (acknowledged) or
``rejections{reason}``; ``records_stored`` + ``duplicates`` = records in acknowledged batches.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST


class CloudMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.batches = Counter("cloudd_batches", "Upload batches acknowledged", registry=self.registry)
        self.records_stored = Counter("cloudd_records_stored", "Records newly stored", registry=self.registry)
        self.duplicates = Counter(
            "cloudd_duplicate_records",
            "Records in acknowledged batches that were already stored",
            registry=self.registry,
        )
        self.rejections = Counter(
            "cloudd_rejections", "Requests refused, by error token", ["reason"], registry=self.registry
        )
        self.store_seconds = Histogram(
            "cloudd_store_seconds", "Time to store one batch durably", registry=self.registry
        )
        self.pending_writes = Gauge(
            "cloudd_pending_store_calls", "Store calls queued or running", registry=self.registry
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
