"""The MQTT adapter against a real mosquitto: backpressure without loss, reconnect with resubscribe."""

from __future__ import annotations

import asyncio

from gwtest_util import publish

from gateway.mqtt.adapter import MqttAdapter, MqttSettings


def settings(url: str, bound: int = 10_000) -> MqttSettings:
    return MqttSettings(url=url, client_id="edgefed-test", inbound_bound=bound, backoff_max_s=0.5)


async def receive_all(adapter: MqttAdapter, n: int) -> list[bytes]:
    out = []
    while len(out) < n:
        message = await adapter.receive(timeout_s=10)
        assert message is not None, f"only {len(out)} of {n} messages arrived"
        out.append(message.payload)
        assert adapter.ack(message)
    return out


async def test_full_inbound_queue_pauses_reading_and_loses_nothing(mosquitto):
    adapter = MqttAdapter(settings(mosquitto.url, bound=5))
    adapter.subscribe("t/#", qos=1)
    await adapter.start()
    try:
        await adapter.wait_connected(10)
        await asyncio.sleep(0.2)  # let the SUBACK arrive
        await asyncio.to_thread(publish, mosquitto.port, [("t/x", b"%d" % i) for i in range(60)])
        for _ in range(200):
            if adapter.counters.paused:
                break
            await asyncio.sleep(0.05)
        assert adapter.counters.paused >= 1
        assert await receive_all(adapter, 60) == [b"%d" % i for i in range(60)]
        assert adapter.stats()["reading_paused"] == 0
    finally:
        await adapter.stop()


async def test_reconnects_and_resubscribes_after_a_broker_restart(mosquitto):
    adapter = MqttAdapter(settings(mosquitto.url))
    adapter.subscribe("t/#", qos=1)
    await adapter.start()
    try:
        await adapter.wait_connected(10)
        await asyncio.to_thread(mosquitto.restart)
        for _ in range(400):
            if adapter.counters.reconnects and adapter.connected:
                break
            await asyncio.sleep(0.05)
        assert adapter.counters.reconnects == 1
        await asyncio.sleep(0.2)
        await asyncio.to_thread(publish, mosquitto.port, [("t/y", b"after restart")])
        assert await receive_all(adapter, 1) == [b"after restart"]
    finally:
        await adapter.stop()
