"""A new core continues each worker's cumulative served cost; decisions do not change."""

from __future__ import annotations

import pytest

from agentq.scheduler import Scheduler, TaskSpec, WorkerSpec
from agentq.scheduler.ledger import UnknownWorkerError

pytestmark = pytest.mark.unit


def fleet(core: Scheduler) -> None:
    for name, weight in (("a", 1.0), ("b", 2.0)):
        core.upsert_worker(WorkerSpec(name, frozenset({"x"}), weight=weight, max_in_flight=9))


def test_served_cost_is_carried_over_and_decisions_are_unchanged() -> None:
    plain, carried = Scheduler(), Scheduler()
    fleet(plain)
    fleet(carried)
    carried.carry_over_served("a", 40.0)
    tasks = [TaskSpec(f"t{i}", frozenset({"x"}), cost=1 + i % 3) for i in range(12)]
    decisions = carried.plan(tasks)
    assert plain.plan(tasks) == decisions
    on_a = next(d for d in decisions if d.worker == "a")
    carried.release(on_a.task, completed=True)
    assert carried.worker_state("a").served_cost == 40.0 + on_a.cost


def test_carry_over_never_lowers_and_refuses_nonsense() -> None:
    core = Scheduler()
    fleet(core)
    core.carry_over_served("b", 5.0)
    core.carry_over_served("b", 3.0)
    assert core.worker_state("b").served_cost == 5.0
    with pytest.raises(ValueError):
        core.carry_over_served("b", -1.0)
    with pytest.raises(UnknownWorkerError):
        core.carry_over_served("nobody", 1.0)
