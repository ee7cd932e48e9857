"""gatewayd with a heartbeat that overruns its stop, for the stop-deadline tests.

``python -m tests.harness.faulty_stop slow|stubborn --config FILE`` runs ``gateway.daemon.main``
with one fault: ``slow``, the heartbeat's stop takes a minute but honours cancellation;
``stubborn``, the heartbeat's task ignores cancellation for ever (as a task that catches
``CancelledError`` in its loop would), so neither its owner nor ``asyncio.run`` can end it.
No real subsystem misbehaves this way on demand, hence the patch (the one kind of fake the house
rules allow: a fault that cannot be caused otherwise).
"""

from __future__ import annotations

import asyncio
import sys

from gateway import daemon
from gateway.heartbeat import HeartbeatSender

SLOW_STOP_S = 60.0


async def slow_stop(self: HeartbeatSender) -> None:
    await asyncio.sleep(SLOW_STOP_S)


async def stubborn_run(self: HeartbeatSender) -> None:
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            continue  # the fault


FAULTS = {"slow": ("stop", slow_stop), "stubborn": ("_run", stubborn_run)}

if __name__ == "__main__":
    attribute, fault = FAULTS[sys.argv[1]]
    setattr(HeartbeatSender, attribute, fault)
    sys.exit(daemon.main(sys.argv[2:]))
