"""The policy engine: picks the next barrier policy from a measured window, tries it, keeps or
reverts it.

Pure: ``propose(table, policy)`` (``rules.py``) reads one window's per-layer table and returns the
policy to try next with its reason; ``judge(before, after)`` keeps or reverts it. ``PolicyEngine``
strings the two together as a small state machine with no clock and no torch.

Invariant: every proposal is a ``SyncPolicy`` over the same layers (``validate``), so whatever the
engine chooses, every gradient is still all-reduced once per iteration: the math stays synchronous
SGD.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from cloud.training.sync.barrier import SyncPolicy, WindowTable
from cloud.training.sync.predict import LinkModel
from cloud.training.sync.rules import EngineConfig, ProposalKind, merge_cap, propose


@dataclass(frozen=True)
class Decision:
    keep: bool
    measure: Literal["blocked", "iteration"]  # what was compared: time compute waited, or wall time
    before_s: float
    after_s: float
    reason: str


def judge(
    before: WindowTable,
    after: WindowTable,
    cfg: EngineConfig = EngineConfig(),
    kind: ProposalKind = "remedy",
) -> Decision:
    """Keep the trial unless it measured clearly worse than the policy before it: a remedy or a
    release by the time compute was held up, a plan by the iteration time the planner predicted
    (a plan trades wire time against launch and forward delays, which blocked time sees only in
    part: two big messages block the forward less than four and still take longer overall)."""
    rel_tol = {"remedy": cfg.keep_rel_tol, "release": cfg.release_rel_tol, "plan": cfg.plan_rel_tol}[kind]
    measure: Literal["blocked", "iteration"] = "iteration" if kind == "plan" else "blocked"
    was, now = (getattr(table, f"{measure}_s") for table in (before, after))
    limit = was * (1 + rel_tol) + cfg.keep_abs_tol_s
    keep = now <= limit
    verdict = "keep" if keep else "revert"
    return Decision(
        keep,
        measure,
        was,
        now,
        f"{verdict}: {measure} {was * 1e3:.2f} -> {now * 1e3:.2f} ms/iter (limit {limit * 1e3:.2f})",
    )


@dataclass
class PolicyEngine:
    """Measure window N, decide window N+1: try a proposal for one window, then keep or revert it.

    Deterministic: the same tables give the same decisions, so every rank that feeds it the same
    (all-gathered) tables applies the same policy at the same iteration.
    """

    policy: SyncPolicy
    cfg: EngineConfig = EngineConfig()
    adaptive: bool = True
    decisions: list[dict] = field(default_factory=list)
    # the trial in progress: (the policy before it, that policy's table, the proposal's kind)
    _trial_from: tuple[SyncPolicy, WindowTable, ProposalKind] | None = None
    _tabu: dict[str, int] = field(default_factory=dict)  # policy text -> window it may be retried after
    _reverts: dict[str, int] = field(default_factory=dict)  # policy text -> times it was reverted
    _merge_caps: list[int] = field(default_factory=list)  # the last windows' link fits (merge_bytes=None)
    # the planner's link fits from the last windows that had one (largest message >= 2x the smallest)
    _links: list[LinkModel] = field(default_factory=list)

    def end_window(self, table: WindowTable) -> SyncPolicy:
        if not self.adaptive or table.window < self.cfg.warmup_windows:
            return self.policy
        self._tabu = {text: until for text, until in self._tabu.items() if until > table.window}
        if self._trial_from is not None:
            previous, baseline, kind = self._trial_from
            self._trial_from = None
            decision = judge(baseline, table, self.cfg, kind)
            if not decision.keep:
                text = self.policy.text()
                self._reverts[text] = self._reverts.get(text, 0) + 1
                self._tabu[text] = table.window + self.cfg.tabu_windows * 2 ** (self._reverts[text] - 1)
                self.policy = previous
                self._log(table.window, "revert", decision.reason, decision)
                return self.policy  # measure the restored policy again before the next trial
            self._log(table.window, "keep", decision.reason, decision)
        fit = LinkModel.fit(table.layers, self.policy)
        self._links = [*self._links[-4:], fit] if fit is not None else self._links
        link = LinkModel.median(self._links) if self._links else None
        proposal = propose(table, self.policy, self._link_sized(table), frozenset(self._tabu), link)
        if proposal.policy != self.policy:
            self._trial_from = (self.policy, table, proposal.kind)
            self.policy = proposal.policy
            self._log(table.window, "try", proposal.reason, None)
        return self.policy

    def _link_sized(self, table: WindowTable) -> EngineConfig:
        """The config with the merge cap fixed to the smallest of the last five windows' link fits:
        one window's fit swings with the box's load, and every swing up would be a merge trial; a
        bucket is merged only when every recent window agrees it is mostly round trip (a merge
        missed costs one round trip, a wrong one delays a whole layer's launch)."""
        if self.cfg.merge_bytes is not None:
            return self.cfg
        self._merge_caps = [*self._merge_caps[-4:], merge_cap(table, self.policy, self.cfg)]
        return replace(self.cfg, merge_bytes=min(self._merge_caps))

    def _log(
        self, window: int, action: Literal["try", "keep", "revert"], reason: str, decision: Decision | None
    ) -> None:
        entry: dict[str, object] = {
            "window": window,
            "action": action,
            "policy": self.policy.text(),
            "reason": reason,
        }
        if decision is not None:
            entry[f"before_{decision.measure}_ms"] = round(decision.before_s * 1e3, 3)
            entry[f"after_{decision.measure}_ms"] = round(decision.after_s * 1e3, 3)
        self.decisions.append(entry)
