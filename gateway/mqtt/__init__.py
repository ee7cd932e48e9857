"""The gateway's one MQTT adapter, paho-mqtt 2.x driven by the daemon's asyncio loop (aiomqtt's way).

    adapter.py        ``MqttAdapter``: the connection's life (connect, reconnect) and its data path
                      (subscriptions, manual acks, publishes)
    socket_driver.py  ``SocketDriver``: paho's socket on the loop, in place of paho's network thread
    packet_limit.py   ``BoundedClient``: paho's client refusing a packet over max_packet_size unread
    batched_client.py ``BatchedClient``, beneath it: one ``recv`` for many packets, many PUBACKs a write
    inbound.py        ``InboundQueue``: what was read, not yet taken; full, it pauses the socket
    paho_options.py   the settings as paho's client, CONNECT, subscribe and publish options
    types.py          the values it takes and gives: settings, the last will, messages, errors, counters

Sensor ingest and the camera use an adapter each; the control plane and gatewayctl use
``types`` without starting a connection.
"""
