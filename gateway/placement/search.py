"""Searching placements: exact enumeration for small graphs, a documented heuristic beyond.

Invariant: every option returned honours the pins it was given (a pinned task is on its side in
every candidate) and runs as placed (no task at the edge after one in the cloud: gatewayd would run
it in the cloud, over a pin if need be; ``TaskGraph.returns_to_edge``), and ``choose`` returns the
candidate combination with the lowest ``model.evaluate`` score among those it examined; the exact
path examines all of them.

Two levels:
1. Per service, the candidate placements. Up to ``EXACT_MAX_FREE`` unpinned tasks: all 2^n
   assignments. Beyond: the *cut points* in topological order (the first k unpinned tasks at the
   edge, the rest in the cloud, k = 0..n) plus a single-flip hill climb from the best cut. For a
   chain whose cloud costs do not exceed its edge costs the optimum is always a cut point (running
   a task at the edge after one in the cloud adds a crossing, slower compute and edge load), so
   the heuristic is exact there; on DAGs it is a local optimum (tests bound the gap).
2. Across services (they share the edge CPU and the uplink): every combination while there are at
   most ``EXACT_MAX_COMBOS``; beyond, coordinate descent in priority order (each service in turn
   takes its best option given the others) until nothing changes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence

from gateway.placement.cost import Budgets, EffectiveLink, Evaluation, Option, evaluate, make_option
from gateway.taskgraphs.graph import SIDES, Side, TaskGraph

EXACT_MAX_FREE = 12
EXACT_MAX_COMBOS = 20_000
_MAX_DESCENT_ROUNDS = 50


def free_positions(service: TaskGraph, pins: Mapping[str, Side]) -> list[int]:
    return [i for i, t in enumerate(service.tasks) if t.name not in pins]


def _sides(
    service: TaskGraph, pins: Mapping[str, Side], free: list[int], choice: Sequence[Side]
) -> list[Side]:
    sides: list[Side] = [pins.get(t.name, "edge") for t in service.tasks]
    for pos, side in zip(free, choice, strict=True):
        sides[pos] = side
    return sides


def _runs_as_placed(service: TaskGraph, sides: Sequence[Side]) -> bool:
    """No task at the edge after one in the cloud: the placement gatewayd can run as it is."""
    return service.returns_to_edge(dict(zip((t.name for t in service.tasks), sides, strict=True))) is None


def _options(service: TaskGraph, pins: Mapping[str, Side], candidates: Iterator[list[Side]]) -> list[Option]:
    return [make_option(service, sides, pins) for sides in candidates if _runs_as_placed(service, sides)]


def enumerate_options(service: TaskGraph, pins: Mapping[str, Side]) -> list[Option]:
    free = free_positions(service, pins)
    choices = itertools.product(SIDES, repeat=len(free))
    return _options(service, pins, (_sides(service, pins, free, choice) for choice in choices))


def _cut(k: int, n: int) -> list[Side]:
    """The first ``k`` of ``n`` free tasks at the edge, the rest in the cloud."""
    return ["edge" if i < k else "cloud" for i in range(n)]


def cut_options(service: TaskGraph, pins: Mapping[str, Side]) -> list[Option]:
    free = free_positions(service, pins)
    cuts = (_sides(service, pins, free, _cut(k, len(free))) for k in range(len(free) + 1))
    return _options(service, pins, cuts)


def heuristic_options(
    service: TaskGraph, pins: Mapping[str, Side], link: EffectiveLink, budgets: Budgets
) -> list[Option]:
    """Cut points plus a hill climb (single flips, best improvement) from the best cut."""
    cuts = cut_options(service, pins)
    free = free_positions(service, pins)
    best = min(cuts, key=lambda o: evaluate([o], link, budgets).score)
    best_score = evaluate([best], link, budgets).score
    improved = True
    while improved:
        improved = False
        for pos in free:
            sides = list(best.sides)
            sides[pos] = "cloud" if sides[pos] == "edge" else "edge"
            if not _runs_as_placed(service, sides):
                continue
            candidate = make_option(service, sides, pins)
            score = evaluate([candidate], link, budgets).score
            if score < best_score:
                best, best_score, improved = candidate, score, True
    unique = {o.sides: o for o in [*cuts, best]}
    return list(unique.values())


def service_options(
    service: TaskGraph, pins: Mapping[str, Side], link: EffectiveLink, budgets: Budgets
) -> tuple[list[Option], str]:
    if len(free_positions(service, pins)) <= EXACT_MAX_FREE:
        return enumerate_options(service, pins), "exact"
    return heuristic_options(service, pins, link, budgets), "heuristic"


def search_exact(
    option_lists: Sequence[Sequence[Option]], link: EffectiveLink, budgets: Budgets
) -> tuple[tuple[Option, ...], Evaluation]:
    best: tuple[Option, ...] | None = None
    best_eval: Evaluation | None = None
    for combo in itertools.product(*option_lists):
        ev = evaluate(combo, link, budgets)
        if best_eval is None or ev.score < best_eval.score:
            best, best_eval = combo, ev
    assert best is not None and best_eval is not None
    return best, best_eval


def search_descent(
    option_lists: Sequence[Sequence[Option]], link: EffectiveLink, budgets: Budgets
) -> tuple[tuple[Option, ...], Evaluation]:
    """Coordinate descent, highest-priority service first; each step strictly improves the score."""
    current = [min(opts, key=lambda o: evaluate([o], link, budgets).score) for opts in option_lists]
    current_eval = evaluate(current, link, budgets)
    order = sorted(range(len(option_lists)), key=lambda i: -option_lists[i][0].service.priority)
    for _ in range(_MAX_DESCENT_ROUNDS):
        changed = False
        for i in order:
            for candidate in option_lists[i]:
                trial = [*current[:i], candidate, *current[i + 1 :]]
                ev = evaluate(trial, link, budgets)
                if ev.score < current_eval.score:
                    current, current_eval, changed = trial, ev, True
        if not changed:
            break
    return tuple(current), current_eval


def choose(
    option_lists: Sequence[Sequence[Option]], link: EffectiveLink, budgets: Budgets
) -> tuple[tuple[Option, ...], Evaluation, str]:
    combos = 1
    for opts in option_lists:
        combos *= len(opts)
    if combos <= EXACT_MAX_COMBOS:
        return (*search_exact(option_lists, link, budgets), "exact")
    return (*search_descent(option_lists, link, budgets), "descent")
