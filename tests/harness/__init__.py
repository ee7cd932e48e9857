"""The one test harness: every tool the tests share, each in one place.

    poll.py                the only waits: ``wait_until`` (blocking) and ``eventually`` (async), which
                           report what they waited for and the last value on timeout
    processes.py           free ports, ``python -m`` children of this checkout, waiting for a port,
                           stopping (SIGTERM, then SIGKILL) and killing processes, their log files
    broker.py              the Mosquitto broker of a test: plain, or the secure one of deploy/mosquitto
    mqtt.py                MQTT clients: publish and wait for acks, read retained messages, subscribe
                           and wait for the SUBACK
    cloudd.py              cloudd as a process (the one way to start it), its tokens, cloudctl
    cloud_http.py          HTTP to cloudd: batches uploaded as a gateway does, heartbeats, operator calls,
                           raw bytes
    gatewayd.py            gatewayd as a process, its config files, the telemetry devices publish
    gatewayctl.py          gatewayctl in this process
    camera.py              ``devicesim camera`` as a process, videos, the scene model, ground truth
    faultproxy.py          a TCP proxy that delays, caps, blackholes, resets and flaps (FaultProxy)
    torchrun.py            pipeline jobs and test worker modules under torchrun, and the workers' side
    pipeline_reference.py  single-process references a pipelined run must equal

Import as ``from tests.harness.<module> import ...`` (the repository root is on pytest's path, see
pyproject.toml, and on PYTHONPATH of every child process the harness starts).
"""
