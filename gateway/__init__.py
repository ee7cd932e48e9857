"""gatewayd, the edge daemon: MQTT and camera ingest, local ONNX inference, the crash-consistent
log, edge-or-cloud placement, store-and-forward to cloudd, local training, the MQTT control plane.
docs/architecture.md maps the subpackages; ``gateway.daemon`` is the process, ``gateway.runner``
its lifecycle."""
