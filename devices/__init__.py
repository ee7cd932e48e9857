"""Device simulators: sensors that publish telemetry over MQTT, and cameras that serve MJPEG.

Invariant: a simulator run with the same seed sends the same messages, and it records what it
sent, so end-to-end checks can account for every message.
"""
