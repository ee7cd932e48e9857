"""One check's outcome: its name, OK / WARN / FAIL / SKIP, and the reason, as one line.

Invariant: a ``Check`` is plain immutable data; ``gatewayctl check`` exits 1 exactly when one of
them is a FAIL (a WARN works but deserves a look; a SKIP was not tried: what it needs failed).
"""

from __future__ import annotations

import os
import ssl
from dataclasses import asdict, dataclass
from typing import Literal

Status = Literal["OK", "WARN", "FAIL", "SKIP"]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def size(n: float) -> str:
    """A byte count for a person: ``1.5 GiB``."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    step = 0
    while abs(n) >= 1024 and step < len(units) - 1:
        n, step = n / 1024, step + 1
    return f"{n:.0f} B" if step == 0 else f"{n:.1f} {units[step]}"


def reason(exc: BaseException) -> str:
    """Why a network call failed, in the system's words where it has them ("Connection refused")."""
    if isinstance(exc, OSError) and exc.errno and not isinstance(exc, ssl.SSLError):  # its errno is not one
        return os.strerror(exc.errno)
    return str(exc) or type(exc).__name__
