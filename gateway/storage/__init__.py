"""The gateway's durable record log: the RecordLog contract (interface.py) and its implementations."""
