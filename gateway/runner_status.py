"""What ``/status`` and the heartbeat show of a running gateway: each subsystem's state and figures,
read when asked (``/status``, the control plane's reports, each heartbeat).

Invariant: a read-only view; it reads the runner's subsystems at each call, and ``/status`` names
every subsystem under its own key (None for placement or the camera when the gateway has none).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gateway.heartbeat import heartbeat_counters, heartbeat_link, heartbeat_placement, heartbeat_services

if TYPE_CHECKING:
    from gateway.runner import GatewayRunner


def gateway_status(runner: GatewayRunner) -> dict[str, Any]:
    log, ingest, uplink = runner.log, runner.ingest, runner.uplink
    return {
        "gateway_id": runner.config.gateway_id,
        "uptime_s": round(time.monotonic() - runner.started_at, 3),
        "mqtt": {"broker": runner.config.mqtt.broker, **runner.mqtt.stats()},
        "log": {
            "log_id": log.log_id,
            **log.stats(),
            "damage": [d.as_dict() for d in log.damage[:20]],
            "scrub": log.scrub.status(),
        },
        "ingest": {
            **ingest.stats(),
            "rejected": sum(ingest.rejected.values()),
            "rejected_by_reason": dict(ingest.rejected),
        },
        "uplink": {
            "state": uplink.state,
            "backlog": uplink.backlog,
            "last_error": uplink.last_error,
            "last_success_ts": uplink.last_success_ts,
            **uplink.figures,
            "failures": dict(uplink.failures),
            "drain": uplink.chooser.status(),
            "corruption": uplink.damage_stop.status(),
        },
        "placement": runner.placement.status() if runner.placement is not None else None,
        "heartbeat": dict(runner.heartbeat.counters),
        "control": runner.control.status(),
        "reload": {**runner.reloads, "last": runner.last_reload},
        "camera": runner.camera.status() if runner.camera is not None else None,
        "training": runner.training.status(),
    }


def heartbeat_fields(runner: GatewayRunner) -> dict[str, Any]:
    """The heartbeat's changing fields (``HeartbeatSender``'s ``describe``)."""
    plan = runner.placement.planner.current if runner.placement is not None else None
    return {
        "backlog_records": runner.uplink.backlog,
        "backlog_bytes": runner.log.stats()["bytes_used"],
        "link": heartbeat_link(runner.link_monitor.snapshot()),
        "placement": heartbeat_placement(plan),
        "services": heartbeat_services(runner.control.states.all()),
        "models": runner.camera.model_figures() if runner.camera is not None else {},
        "counters": heartbeat_counters(runner.log.stats(), runner.ingest.rejected, runner.uplink.figures),
    }
