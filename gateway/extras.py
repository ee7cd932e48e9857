"""Which of the optional parts of edgefed (the extras in pyproject.toml) this install has, and what a
gateway does about a config section whose extra is missing (docs/gateway.md, "Installing").

``pip install edgefed`` is the gateway core; a section that needs more says so in one line:
``[camera] needs the "camera" extra: pip install 'edgefed[camera]'``. At start a config file that
enables such a section is refused with it (``missing_extras``, exit 2); over the control plane (or a
reload) enabling it fails with the same line (``NeedsExtraHandler``) and the daemon keeps running.

Invariant: nothing here imports a heavy package. An extra counts as installed when every module it
provides is found on the path (``importlib.util.find_spec``), which costs a directory lookup, not an
import of torch.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from pydantic import BaseModel

from gateway.control.handlers import Applied, ServiceHandler
from protocol.config import GatewayConfig

# extra -> the top-level modules the gateway imports from it (the extra's distributions in pyproject.toml)
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "camera": ("numpy", "cv2", "onnxruntime"),
    "train": ("numpy", "torch"),
}
# config section (and control-plane service of the same name) -> the extra it needs to run
SECTION_EXTRA: dict[str, str] = {"camera": "camera", "training": "train"}


def module_installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def missing_modules(extra: str, installed: Callable[[str], bool] = module_installed) -> tuple[str, ...]:
    """The modules of ``extra`` this install lacks; empty: the extra is installed."""
    return tuple(name for name in EXTRA_MODULES[extra] if not installed(name))


def extra_installed(extra: str) -> bool:
    return not missing_modules(extra)


def needs_extra(section: str, missing: tuple[str, ...]) -> str:
    """The one line that says ``[section]`` cannot run here and how to fix that."""
    extra = SECTION_EXTRA[section]
    return (
        f"[{section}] needs the \"{extra}\" extra: pip install 'edgefed[{extra}]' "
        f"(not installed: {', '.join(missing)})"
    )


def missing_extras(config: GatewayConfig, installed: Callable[[str], bool] = module_installed) -> list[str]:
    """A ``needs_extra`` line for each section the config file enables whose extra is missing."""
    enabled = {
        "camera": config.camera is not None and config.camera.enabled,
        "training": config.training.enabled,
    }
    lines = []
    for section, on in enabled.items():
        missing = missing_modules(SECTION_EXTRA[section], installed)
        if on and missing:
            lines.append(needs_extra(section, missing))
    return lines


class NeedsExtraHandler:
    """The control plane's handler for a service whose extra is missing: enabling it fails with the
    ``needs_extra`` line (nothing is started); disabling it goes to ``when_off`` (the service's own
    handler, where the gateway has one without the extra) or is simply so."""

    def __init__(
        self,
        section: str,
        when_off: ServiceHandler | None = None,
        installed: Callable[[str], bool] = module_installed,
    ) -> None:
        self.line = needs_extra(section, missing_modules(SECTION_EXTRA[section], installed))
        self._when_off = when_off

    async def apply(self, settings: BaseModel) -> Applied:
        if getattr(settings, "enabled", False):
            return Applied("failed", False, self.line)
        if self._when_off is not None:
            return await self._when_off.apply(settings)
        return Applied("stopped", True, f"off; enabling it fails here: {self.line}")

    def health(self) -> Applied | None:
        """Off, it runs nothing whose health could change: the last ``apply`` stands."""
        return None
