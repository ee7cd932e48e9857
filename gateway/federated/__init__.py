"""gateway.federated: local training on data that stays on the gateway, and the updates it sends.

Owns the local trainer (bounded threads and CPU duty cycle), the update encoder (block floating
point, optional top-k with error feedback), the client that fetches the global model and writes
updates into the uplink log, and the pure "upload raw or train locally" choice. Nothing here is
imported by gatewayd unless a local-training service is enabled (torch is heavy).
"""
