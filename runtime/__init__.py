"""runtime: the small runtime that both daemons stand on, written once and tested once.

    files.py    durable file writes: ``atomic_write`` / ``atomic_writer`` (temp file, fsync, rename,
                fsync of the folder) and ``fsync_dir``
    backoff.py  ``Backoff``: exponential retry delays with jitter, one rule for every retry loop
    tasks.py    ``cancel_and_wait``: how the owner of an asyncio task ends it

It sits below ``gateway`` and ``cloud`` (both import it) and imports nothing from edgefed.
"""
