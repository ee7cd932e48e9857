"""Sensor telemetry in: MQTT messages judged, logged and acknowledged once durable (sensors.py), and
redeliveries recognised (recent_samples.py). Cameras are gateway/camera/."""
