"""Data-parallel synchronisation: barrier-scheduled per-layer all-reduce (``SyncScheduler``) and
heterogeneous-rank balancing (``Balancer``); the pure policy and split math live beside them."""
