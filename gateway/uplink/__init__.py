"""Store-and-forward from the log to the cloud (sender.py)."""
