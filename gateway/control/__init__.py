"""The gateway's MQTT control plane: desired config per service (versioned, persisted), requests and
responses, service state, the recent-errors ring, and the systemd notify protocol."""
