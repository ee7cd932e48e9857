"""The deep-learning cluster scheduler (Blox, EuroSys'24): small modules composed by configuration.

A round (``round.Scheduler``) takes the cluster (``cluster.py``) and the jobs (``jobs.py``) and
returns a plan (``decision.py``): which jobs start where and which are preempted. The modules it
composes are admission (``admission.py``), a policy (``policies/``: one file per policy, a registry
in ``policies/__init__.py``), placement (``placement.py``) and metrics (``metrics.py``). The same
rounds drive a trace simulator (``sim.py`` over ``trace.py``; figures in ``outcomes.py``) and
cloudd's real torchrun jobs, both through the ``backend.Backend`` protocol. Pure Python: no torch
here. docs/scheduler.md is the guide.
"""
