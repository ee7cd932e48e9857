"""What a reload of the config file (SIGHUP, ``systemctl reload``) can apply live, and what waits for
the next restart: a pure comparison of the running config with the new file's.

Invariant: every field of GatewayConfig is either applied live (``[devices] allow``, ``log_level``,
``[placement] pins``, the control plane's services: ``[camera]`` enabled/source/sample_fps,
``[training]`` enabled/private) or named by ``restart_needed_for`` when it changed.
"""

from __future__ import annotations

from typing import Any

from protocol.config import GatewayConfig

RESTART_ONLY = ("gateway_id", "data_dir", "mqtt", "http", "log", "uplink", "sensor")
CAMERA_LIVE_FIELDS: dict[str, Any] = {"enabled": None, "source": None, "sample_fps": None}
TRAINING_LIVE_FIELDS: dict[str, Any] = {"enabled": False, "private": True}
PLACEMENT_LIVE_FIELDS: dict[str, Any] = {"pins": {}}


def restart_needed_for(old: GatewayConfig, new: GatewayConfig) -> list[str]:
    """The parts of ``new`` that differ from ``old`` and take effect only at the next restart."""
    later = [name for name in RESTART_ONLY if getattr(new, name) != getattr(old, name)]
    if _differs(old.placement, new.placement, PLACEMENT_LIVE_FIELDS):
        later.append("placement (other than pins)")
    if (old.camera is None) != (new.camera is None) or _differs(old.camera, new.camera, CAMERA_LIVE_FIELDS):
        later.append("camera (other than enabled, source, sample_fps)")
    if _differs(old.training, new.training, TRAINING_LIVE_FIELDS):
        later.append("training (other than enabled, private)")
    return later


def applied_live(old: GatewayConfig, new: GatewayConfig) -> GatewayConfig:
    """``old`` with the fields a reload applies at once taken from ``new``."""
    return old.model_copy(
        update={"devices": new.devices, "log_level": new.log_level, "placement": new.placement}
    )


def _differs(old: Any, new: Any, live: dict[str, Any]) -> bool:
    """Whether two sections differ outside their ``live`` fields (None sections never differ here)."""
    if old is None or new is None:
        return False
    return bool(old.model_copy(update=live) != new.model_copy(update=live))
