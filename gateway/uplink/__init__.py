"""Store-and-forward from the log to the cloud (sender.py: the loop; ledger.py: the books; wire.py:
a batch on the wire)."""
