"""The MQTT adapter against a real mosquitto: backpressure without loss, reconnect with resubscribe."""

from __future__ import annotations

import asyncio

from gateway.mqtt.adapter import InboundMessage, MqttAdapter, MqttSettings
from tests.harness.mqtt import publish
from tests.harness.poll import eventually

# Retained on the broker before the adapter subscribes: the broker sends it in answer to each SUBSCRIBE
# to t/#, so its arrival tells the test that the subscription exists (publishing earlier would lose
# messages to a subscription still in flight).
MARKER = "t/subscribed"


def settings(url: str, bound: int = 10_000) -> MqttSettings:
    return MqttSettings(url=url, client_id="edgefed-test", inbound_bound=bound, backoff_max_s=0.5)


async def started_adapter(broker, bound: int = 10_000) -> MqttAdapter:
    await asyncio.to_thread(publish, broker.port, [(MARKER, b"marker")], retain=True)
    adapter = MqttAdapter(settings(broker.url, bound))
    adapter.subscribe("t/#", qos=1)
    await adapter.start()
    await adapter.wait_connected(10)
    return adapter


async def until_subscribed(adapter: MqttAdapter) -> None:
    """Take the retained marker the broker sends once it has made the subscription."""
    message = await adapter.receive(timeout_s=10)
    assert message is not None, "no retained marker: the broker made no subscription to t/#"
    assert message.topic == MARKER, message
    assert adapter.ack(message)


async def receive_all(adapter: MqttAdapter, n: int) -> list[bytes]:
    out = []
    while len(out) < n:
        message = await adapter.receive(timeout_s=10)
        assert message is not None, f"only {len(out)} of {n} messages arrived"
        out.append(message.payload)
        assert adapter.ack(message)
    return out


async def test_full_inbound_queue_pauses_reading_and_loses_nothing(mosquitto):
    adapter = await started_adapter(mosquitto, bound=5)
    try:
        await until_subscribed(adapter)
        await asyncio.to_thread(publish, mosquitto.port, [("t/x", b"%d" % i) for i in range(60)])
        await eventually(lambda: adapter.counters.paused, 10, "the adapter to pause reading (queue full)")
        assert await receive_all(adapter, 60) == [b"%d" % i for i in range(60)]
        assert adapter.stats()["reading_paused"] == 0
    finally:
        await adapter.stop()


async def test_reconnects_and_resubscribes_after_a_broker_restart(mosquitto):
    adapter = await started_adapter(mosquitto)
    try:
        await until_subscribed(adapter)
        await asyncio.to_thread(mosquitto.restart)
        await eventually(
            lambda: adapter.counters.reconnects and adapter.connected, 20, "the adapter to reconnect"
        )
        assert adapter.counters.reconnects == 1
        await until_subscribed(adapter)  # the marker again: the adapter subscribed anew
        await asyncio.to_thread(publish, mosquitto.port, [("t/y", b"after restart")])
        assert await receive_all(adapter, 1) == [b"after restart"]
    finally:
        await adapter.stop()


async def test_batches_come_in_arrival_order_and_their_acks_in_one_write_reach_the_broker(mosquitto):
    """Packets of many sizes, so that they straddle the reader's 64 KiB reads; a small queue, so that
    reading pauses and resumes with bytes read ahead. Every PUBACK reached the broker: the same
    session, taken up again, gets nothing a second time (the broker resends what is unacked before
    what was queued for it since)."""
    payloads = [b"%d:" % i + b"x" * (i * 37 % 900) for i in range(3000)]
    adapter = await started_adapter(mosquitto, bound=300)
    try:
        await until_subscribed(adapter)
        await asyncio.to_thread(publish, mosquitto.port, [("t/b", p) for p in payloads])
        taken: list[InboundMessage] = []
        while len(taken) < len(payloads):
            batch = await adapter.receive_batch(10, 256)
            assert batch, f"only {len(taken)} of {len(payloads)} messages arrived"
            assert adapter.ack_many(batch) == len(batch)
            taken += batch
        assert [m.payload for m in taken] == payloads
        assert adapter.counters.paused and adapter.counters.acks_sent == len(payloads) + 1
    finally:
        await adapter.stop()
    await asyncio.to_thread(publish, mosquitto.port, [("t/b", b"after")])  # queued for the session
    again = await started_adapter(mosquitto)
    try:
        before_after = []  # what the broker sends the session before "after": markers only, no resend
        while (message := await again.receive(timeout_s=10)) is not None and message.payload != b"after":
            before_after.append(message.topic)
            assert again.ack(message)
        assert message is not None, "the message queued for the session never came"
        assert set(before_after) <= {MARKER}, before_after
    finally:
        await again.stop()
