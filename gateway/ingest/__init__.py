"""Sources of records: sensors over MQTT (sensors.py) and cameras (camera.py)."""
