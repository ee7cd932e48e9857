"""What ``/metrics`` exports for a running gateway: each subsystem's counters and gauges, read when
scraped (gateway/metrics.py turns them into Prometheus families).

Invariant: a read-only view; it holds the runner and reads its subsystems' figures at each scrape,
so a scrape never sees a figure older than the scrape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.metrics import StatsCollector

if TYPE_CHECKING:
    from gateway.runner import GatewayRunner

LOG_GAUGES = {
    "durable_lsn",
    "trimmed_lsn",
    "next_lsn",
    "bytes_used",
    "max_bytes",
    "buffered_bytes",
    "segments",
    "scrub_running",
    "scrub_last_damage",
}


def gateway_collector(runner: GatewayRunner) -> StatsCollector:
    collector = StatsCollector(runner.config.gateway_id)
    collector.add("mqtt", runner.mqtt.stats, gauges={"connected", "inbound_queued", "reading_paused"})
    collector.add("log", runner.log.stats, gauges=LOG_GAUGES)
    collector.add("ingest", runner.ingest.stats, gauges={"awaiting_ack", "windows_open"})
    collector.add_labeled_counter(
        "ingest_rejected", "device messages rejected, by reason", "reason", lambda: runner.ingest.rejected
    )
    uplink = runner.uplink
    collector.add(
        "uplink", lambda: {**uplink.figures, "backlog": uplink.backlog}, gauges={"backlog", "stopped_at_lsn"}
    )
    collector.add_labeled_counter(
        "uplink_failures", "failed uploads, by kind", "kind", lambda: uplink.failures
    )
    collector.add("control", runner.control.stats, gauges={"revision"})
    collector.add_labeled_counter(
        "control_refused", "control requests refused, by reason", "reason", lambda: runner.control.refused
    )
    collector.add("reload", lambda: dict(runner.reloads))
    collector.add("heartbeat", lambda: dict(runner.heartbeat.counters))
    if runner.camera is not None:  # imported only with a camera: the core never loads cv2 or onnxruntime
        from gateway.camera.runner import METRIC_GAUGES

        collector.add("camera", runner.camera.metrics, gauges=METRIC_GAUGES)
    from gateway.federated.runner import METRIC_GAUGES as TRAINING_GAUGES

    collector.add("training", runner.training.metrics, gauges=TRAINING_GAUGES)
    return collector
