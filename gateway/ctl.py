"""gatewayctl: talk to a gateway over MQTT. For now one command: ``status`` (the retained status topic).

Invariant: read-only, and every wait has a timeout; no status within it -> exit 1 with a message.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys

from gateway.mqtt import MqttAdapter, MqttError, MqttSettings
from protocol.topics import check_id, status_topic

EXIT_OK, EXIT_NO_STATUS, EXIT_USAGE = 0, 1, 2


async def read_status(broker: str, gateway_id: str, timeout_s: float) -> dict | None:
    settings = MqttSettings(url=broker, client_id=f"gatewayctl-{secrets.token_hex(4)}",
                            persistent_session=False, manual_ack=False, inbound_bound=16,
                            connect_timeout_s=timeout_s, backoff_max_s=1.0)
    adapter = MqttAdapter(settings)
    adapter.subscribe(status_topic(gateway_id), qos=1)
    await adapter.start()
    try:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            message = await adapter.receive(timeout_s=left)
            if message is not None and message.topic == status_topic(gateway_id):
                return json.loads(message.payload)
        return None
    finally:
        await adapter.stop(timeout_s=2.0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gatewayctl", description="edgefed gateway control")
    parser.add_argument("--broker", required=True, help="mqtt://HOST:PORT or mqtts://HOST:PORT")
    parser.add_argument("--gateway", required=True, help="gateway id")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the status")
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser("status", help="show the gateway's retained status")
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    args = parser.parse_args(argv)
    try:
        check_id("gateway", args.gateway)
        result = asyncio.run(read_status(args.broker, args.gateway, args.timeout))
    except (ValueError, MqttError) as exc:
        print(f"gatewayctl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except json.JSONDecodeError:
        print(f"gatewayctl: gateway {args.gateway} published a status that is not JSON", file=sys.stderr)
        return EXIT_NO_STATUS
    if result is None:
        print(f"gatewayctl: gateway {args.gateway} offline or no status (nothing on "
              f"{status_topic(args.gateway)} within {args.timeout:g}s)", file=sys.stderr)
        return EXIT_NO_STATUS
    if args.json:
        print(json.dumps(result))
    else:
        print(f"gateway {result.get('gateway', args.gateway)}: {result.get('state', '?')} "
              f"(since {result.get('ts', '?')})")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
