"""Spanning-tree collectives (Blink, MLSys'20) and reliability classes (RAIL, NSDI'17).

A collective is a plan made as data and then run: builders (``plans``) turn a fabric
(``topology``: ranks, directed links with bandwidth, latency, loss and cost) into a ``Program``
(``program``: for each rank, steps of sends and receives of chunks of one flat tensor), packed
from directed spanning trees (``packing``) and split over them by their rates; ``validate`` checks
a program is the collective it claims before anything runs it; ``simulate`` predicts its time on a
topology; ``execute`` runs it over ``torch.distributed`` point-to-point (gloo on CPU, NCCL on
GPUs), on an emulated fabric (``fabric``) in tests and benchmarks. ``reliability`` groups paths
into RAIL classes and restricts a job to the links of its class.

Invariant: only a program that ``validate`` accepted is executed or simulated, and executing it
leaves every rank with the collective torch.distributed would have computed.
"""
