"""Sensor telemetry in: MQTT messages judged a batch at a time (judge.py), logged and acknowledged
once durable (sensors.py), and redeliveries recognised (recent_samples.py). Cameras are
gateway/camera/."""
