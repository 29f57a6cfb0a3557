"""The demo's fairness check: each worker's assigned cost against the proven DRR bound."""

from __future__ import annotations

import pytest

from agentq.demo import shares
from agentq.scheduler import Scheduler, TaskSpec, WorkerSpec

pytestmark = pytest.mark.unit

WEIGHTS = {"small": 1.0, "medium": 2.0, "large": 4.0}


def test_the_bound_is_the_one_in_docs_scheduling() -> None:
    result = {s.worker: s for s in shares(WEIGHTS, [("large", 3.0), ("small", 1.0)])}
    # C = 3, n = 3, W = 7: low = -C (n-1) w / W, high = C (W - w) / W.
    assert result["small"].low == pytest.approx(-3 * 2 * 1 / 7)
    assert result["small"].high == pytest.approx(3 * 6 / 7)
    assert result["large"].low == pytest.approx(-3 * 2 * 4 / 7)
    assert result["large"].fair == pytest.approx(4 * 4 / 7)
    assert result["medium"].cost == 0


def test_the_scheduling_core_stays_within_it_and_a_skewed_split_does_not() -> None:
    core = Scheduler()
    for name, weight in WEIGHTS.items():
        core.upsert_worker(WorkerSpec(name, frozenset({"llm"}), weight=weight, max_in_flight=1000))
    costs = [1.0 + i % 3 for i in range(60)]
    plan = core.plan([TaskSpec(f"t{i}", frozenset({"llm"}), cost=c) for i, c in enumerate(costs)])
    fair = shares(WEIGHTS, [(a.worker, a.cost) for a in plan])
    assert all(s.within for s in fair), fair
    skewed = shares(
        WEIGHTS, [("small", c) for c in costs[:10]] + [("large", c) for c in costs[10:]]
    )
    assert not all(s.within for s in skewed)
