"""docs/scheduler.md stays true: its worked policy example runs as written, and its tables name
every registered policy, admission rule and placement."""

from __future__ import annotations

import re
from pathlib import Path

from cloud.scheduler.admission import ADMISSIONS
from cloud.scheduler.placement import PLACEMENTS
from cloud.scheduler.policies import POLICIES
from cloud.scheduler.policies.base import Policy
from cloud.scheduler.round import Scheduler
from tests.scheduler.helpers import cluster, job

DOC = (Path(__file__).resolve().parents[2] / "docs" / "scheduler.md").read_text()


def test_the_worked_policy_example_runs_as_written() -> None:
    section = DOC[DOC.index("\n## Writing a policy\n") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)  # type: ignore[union-attr]
    namespace: dict[str, object] = {"__name__": "docs_example"}
    exec(compile(code, "docs/scheduler.md", "exec"), namespace)
    policy_class = namespace["FewestDevices"]
    assert isinstance(policy_class, type) and issubclass(policy_class, Policy)
    c = cluster(("a", 8, "g"))
    big, small = job("big", devices=8, at=0.0), job("small", devices=1, at=1.0)
    plan = Scheduler(ADMISSIONS["accept_all"](), policy_class(), PLACEMENTS["consolidated"]()).round(
        c, [big, small], now=1.0
    )
    assert [e.job_id for e in plan.order] == ["small", "big"]


def test_the_tables_name_every_registered_module() -> None:
    for name in (*POLICIES, *ADMISSIONS, *PLACEMENTS):
        assert f"`{name}`" in DOC, name
