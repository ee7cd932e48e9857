"""The control op ``log.verify`` (``gatewayctl log verify``): verify the gateway's whole log now.

The log's scrub (gateway/storage/scrub.py) runs the pass at full speed in its own task; the op
waits for it at most the request's ``wait_s`` and answers the scrub's status: ``done`` and the
pass's report (segments, records, bytes, MB/s, every damage with its segment, byte offset and
first unreadable LSN), or ``done`` false and the bytes verified so far (the pass goes on; asking
again gives its result). ``describe`` and ``exit_code`` are gatewayctl's side.

Invariant: the op holds the control plane at most ``wait_s`` (<= 60 s, default 0), and a pass that
found damage is never described as clean: ``exit_code`` is 4 for it, 1 for a pass not done yet or
failed (no result), 0 only for a pass that ended and found nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from gateway.storage.scrub import Scrubber
from protocol.control import LogVerifyRequest

EXIT_DAMAGED, EXIT_NO_RESULT = 4, 1


def log_verify_op(scrub: Scrubber) -> Callable[[LogVerifyRequest], Awaitable[dict[str, Any]]]:
    async def answer(request: LogVerifyRequest) -> dict[str, Any]:
        return await scrub.request(request.wait_s)

    return answer


def exit_code(data: dict[str, Any]) -> int:
    if not data.get("done") or data["last"] is None:  # still running, or the pass failed
        return EXIT_NO_RESULT
    return EXIT_DAMAGED if data["last"]["damage"] else 0


def describe(data: dict[str, Any]) -> str:
    """gatewayctl's lines for an answer: the verdict first, then one line per damage."""
    if not data.get("done"):
        error = f" (last pass failed: {data['last_error']})" if data.get("last_error") else ""
        return f"log verify still running: {data['running_bytes'] / 1e6:.1f} MB so far; ask again{error}"
    report = data["last"]
    if report is None:
        return f"log verify failed: {data.get('last_error') or 'no report'}"
    head = (
        f"log verified: {report['segments']} segments, {report['records']} records, "
        f"{report['bytes'] / 1e6:.1f} MB in {report['seconds']:.2f}s ({report['mb_per_s']} MB/s): "
    )
    damage = report["damage"]
    if not damage:
        return head + "no damage"
    lines = [head + f"{len(damage)} damaged"]
    for d in damage:
        at = f" (from lsn {d['lsn']})" if d["lsn"] else ""
        lines.append(f"  {d['segment']} byte {d['offset']}{at}: {d['detail']}")
    return "\n".join(lines)
