"""``gatewayctl check``: the preflight an operator runs on the gateway's box, before (or instead of)
starting gatewayd, from the same config file: the config, the extras it needs, the data dir, its
lock, the disk, the HTTP port, the broker (reachable, TLS, login), the cloud (reachable, token) and
the clock. Each check is one line, OK / WARN / FAIL / SKIP with the reason (docs/gateway.md,
"Checking a box: gatewayctl check").
"""
