"""Where the uplink stops: the first damage in the log (docs/storage.md, "Damage").

The log knows of damage (``RecordLog.damage``: found at recovery, by a read, or by its scrub), or a
read raises ``LogCorrupted``: records from ``damage.lsn`` on cannot be read past it. The uplink sends
what is before the lowest such LSN past the trim point and nothing at or after it, so the log's trim
point (a prefix trim, up to the acknowledged run) never passes it, and from then on no record past it
goes up. The operator sees it in /status (``uplink.state`` "corrupt", ``uplink.corruption``),
/metrics (``edgefed_gateway_uplink_stopped_at_lsn``) and one error line.

Owner: one ``Uplink`` (its task). Invariant: while a damage is held, ``readable_upto`` is below its
LSN; it is let go only once the log's trim point has passed it (policy "drop_oldest" dropped it, a
loss the log counts and reports as a gap).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from gateway.storage.interface import Damage
from gateway.uplink.chooser import BatchChooser

log = logging.getLogger(__name__)


class DamageStop:
    def __init__(self) -> None:
        self.damage: Damage | None = None
        self.stops = 0

    def consider(self, found: Iterable[Damage], trimmed_lsn: int, chooser: BatchChooser) -> None:
        """Hold below the lowest damage of ``found`` past the trim point; a new, lower stop makes
        ``chooser`` forget what it holds from there."""
        if self.damage is not None and trimmed_lsn >= self.damage.lsn:
            log.warning("uplink: the log dropped past the damage at lsn %d; uploading again", self.damage.lsn)
            self.damage = None
        lowest = min((d for d in found if d.lsn > trimmed_lsn), key=lambda d: d.lsn, default=None)
        if lowest is None or (self.damage is not None and self.damage.lsn <= lowest.lsn):
            return
        chooser.stop_at(lowest.lsn)
        self.damage = lowest
        self.stops += 1
        log.error(
            "uplink: stopped at lsn %d: the log is damaged there (%s); nothing from there on is "
            'uploaded or trimmed until the damage is dealt with (docs/storage.md, "Damage")',
            lowest.lsn,
            lowest,
        )

    def readable_upto(self, durable_lsn: int) -> int:
        """The last LSN the uplink may read and send now."""
        return durable_lsn if self.damage is None else min(durable_lsn, self.damage.lsn - 1)

    def status(self) -> dict[str, Any] | None:
        return self.damage.as_dict() if self.damage is not None else None

    def figures(self) -> dict[str, float]:
        """``corruption_stops`` (counter), ``stopped_at_lsn`` (gauge: 0 when not stopped)."""
        return {"corruption_stops": self.stops, "stopped_at_lsn": self.damage.lsn if self.damage else 0}
