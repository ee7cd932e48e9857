"""The preemption lease: the job file's ``[preemption] lease``, a file whose presence means "keep
training". Whoever runs the job (cloudd's JobManager) creates it before the launch and revokes it
by deleting it; the trainer checks it at step boundaries and, once revoked, stops at a step every
rank agrees on, writes a complete checkpoint of that step and exits with ``EXIT_PREEMPTED``.

Invariant: every rank calls ``Lease.revoked`` at the same steps and gets the same answer (rank 0
looks at the file, one broadcast of one integer tells the others), so all ranks stop after the
same step; with no lease configured nothing is looked at or sent.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from cloud.training import comm


class Lease:
    def __init__(self, path: str, check_every: int) -> None:
        self.path, self.check_every = path, check_every

    def revoked(self, step: int) -> bool:
        """Every rank, after each step: True when the lease is gone (checked every ``check_every``
        steps; a collective on those steps)."""
        if not self.path or step % self.check_every:
            return False
        flag = torch.tensor([0 if dist.get_rank() != 0 else int(not os.path.exists(self.path))])
        flag = flag.to(comm.wire_device())
        dist.broadcast(flag, src=0)
        return bool(flag.item())
