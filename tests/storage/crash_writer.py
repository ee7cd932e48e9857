"""A writer process for the kill -9 test: appends epochs as fast as it can until it is killed.

Prints, flushing each line: ``READY <durable lsn>`` after open, ``D <lsn>`` when the epoch ending
at <lsn> is notified durable, ``T <lsn>`` when a trim to <lsn> has returned.

    python -m tests.storage.crash_writer DIR SEED          one writer, lines on stdout
    python -m tests.storage.crash_writer --zygote          many writers, forked on request

(from the repository root, as tests/storage/test_kill9.py runs it).

The zygote saves the interpreter start per trial: it reads ``RUN DIR SEED OUTFILE`` and answers
``PID <pid>`` (the forked writer prints its lines into OUTFILE, written unbuffered, which a kill
does not lose), and ``KILL <pid>``, which it answers with ``DEAD <pid>`` once the writer is reaped.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys

from gateway.storage.epoch_log import EpochLog
from gateway.storage.log_format import RECORD_HEADER_BYTES
from tests.storage.storagetest_workload import payload

_out_fd = 1
BUFFER_BYTES = 2 << 20


def emit(line: str) -> None:
    os.write(_out_fd, (line + "\n").encode())


async def main(directory: str, seed: int) -> None:
    rng = random.Random(seed)
    log = EpochLog(
        directory,
        segment_bytes=256 * 1024,
        max_bytes=64 << 20,
        buffer_bytes=BUFFER_BYTES,
        writer_threads=2,
        rng=random.Random(seed + 1),
    )
    await log.open()
    emit(f"READY {log.durable_lsn}")
    kept = 2000  # keep the directory small: trim all but about this many records (at an epoch end)
    epoch_ends: list[int] = []
    while True:
        size = rng.choice((1, 1, 2, 5, 16, 40, 200))
        tag = rng.getrandbits(32)
        first = log.stats()["next_lsn"]
        records = [payload(first + index, tag, size, index) for index in range(size)]
        # The checker treats each flush() as one epoch. When the buffer fills, the log closes the
        # open epoch early (docs/storage.md: a finer split keeps the prefix guarantee), which would
        # split this one where the checker cannot see it: wait until the whole epoch fits.
        epoch_bytes = sum(len(record) + RECORD_HEADER_BYTES for record in records)
        while log.stats()["buffered_bytes"] + epoch_bytes > BUFFER_BYTES:
            await asyncio.sleep(0.001)
        for record in records:
            await log.append(record)
        epoch = await log.flush()
        epoch.durable.add_done_callback(lambda f, last=epoch.last_lsn: f.exception() or emit(f"D {last}"))
        epoch_ends.append(epoch.last_lsn)
        ends = [end for end in epoch_ends if end <= log.durable_lsn - kept]
        if ends and log.durable_lsn - log.trimmed_lsn > 2 * kept:
            await log.trim(ends[-1])
            emit(f"T {log.trimmed_lsn}")
            epoch_ends = [end for end in epoch_ends if end > ends[-1]]
        await asyncio.sleep(0)


def zygote() -> None:
    global _out_fd
    for line in sys.stdin:
        command, *args = line.split()
        if command == "RUN":
            pid = os.fork()
            if pid == 0:
                _out_fd = os.open(args[2], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
                try:
                    asyncio.run(main(args[0], int(args[1])))
                finally:
                    os._exit(1)
            print(f"PID {pid}", flush=True)
        elif command == "KILL":
            pid = int(args[0])
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            print(f"DEAD {pid}", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "--zygote":
        zygote()
    else:
        asyncio.run(main(sys.argv[1], int(sys.argv[2])))
