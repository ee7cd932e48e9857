"""What crosses a process boundary in edgefed: MQTT topic names, payload schemas, the upload batch.

Invariant: every payload type here carries a schema version field ``v``; a reader refuses a
version it does not know instead of guessing. This package imports nothing else from edgefed.
"""

from protocol.errors import ProtocolError

__all__ = ["ProtocolError"]
