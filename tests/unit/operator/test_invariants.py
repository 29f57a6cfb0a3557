"""check_invariants catches each index corrupted on purpose, and the resync repairs it.

Every other harness test runs check_invariants after every step (Harness is strict)
and fails on any difference: these tests prove that the check can fail, index by
index.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agentq.claims import Readiness
from agentq.operator.controller import Controller
from agentq.operator.work import TIMER_TASK
from builders import task
from harness import NS, Harness, run


async def fleet() -> Harness:
    """Workers, a running claim, a pending task in backoff, one no worker can take."""
    h = Harness()
    h.worker("w1", "llm", max_in_flight=1, lease_seconds=1000)
    h.worker("w2", "gpu", max_in_flight=1, lease_seconds=1000)
    h.task(task("run").requires("llm").lease(1000))
    h.task(task("wait").requires("llm"))  # w1 is full: pending, queued
    h.task(task("gpu").requires("gpu").lease(1000))
    h.task(task("lonely").requires("quantum"))  # Unschedulable
    await h.settle()
    h.renew("run")
    await h.settle()
    assert h.phase("run") == "Running" and h.phase("wait") == "Pending"
    assert not h.controller.check_invariants()
    return h


def corrupt_queue(c: Controller) -> None:
    c.indexes.queue.remove((NS, "wait"))


def corrupt_queued(c: Controller) -> None:
    c.indexes.queue.unqueue((NS, "wait"))


def corrupt_claims(c: Controller) -> None:
    c.indexes.claims[(NS, "w2")].discard("gpu")


def corrupt_phases(c: Controller) -> None:
    c.indexes.phases["Running"] += 1


def corrupt_offered(c: Controller) -> None:
    c.indexes.offered[NS][(NS, "w2")] = frozenset({"llm"})


def corrupt_verdict(c: Controller) -> None:
    c.indexes.uncovered[(NS, frozenset({"quantum"}))] = None


def corrupt_core_load(c: Controller) -> None:
    c.cores.of(NS).release("run", completed=False)


def corrupt_core_worker(c: Controller) -> None:
    c.cores.of(NS).remove_worker("w2")


def corrupt_readiness(c: Controller) -> None:
    record = c.store.workers[(NS, "w1")]
    record.readiness = (Readiness.LEASE_STALE, "made up")


def corrupt_timers(c: Controller) -> None:
    c.agenda.timers.clear()


def corrupt_claim_timer(c: Controller) -> None:
    # The running claim's timer, pushed to long after its Lease expires.
    c.agenda.timers.clear()
    c.agenda.timers.push(c.clock.monotonic() + 10_000, (TIMER_TASK, (NS, "run")))


def corrupt_writes(c: Controller) -> None:
    c.store.busy += 1


def corrupt_changes(c: Controller) -> None:
    c.store.changed.task((NS, "run"))


CASES: list[tuple[str, Callable[[Controller], None], str]] = [
    ("a pending task lost from the queue", corrupt_queue, "queue"),
    ("a grantable task not queued", corrupt_queued, "queue"),
    ("a claim missing from its worker", corrupt_claims, "claims"),
    ("a phase miscounted", corrupt_phases, "phases"),
    ("capabilities offered wrongly", corrupt_offered, "coverage"),
    ("a stale Unschedulable verdict", corrupt_verdict, "coverage"),
    ("a claim not loading its worker", corrupt_core_load, "cores"),
    ("a worker missing from its core", corrupt_core_worker, "cores"),
    ("a worker's readiness wrong", corrupt_readiness, "readiness"),
    ("every timer lost", corrupt_timers, "timers"),
    ("a claim's timer later than its expiry", corrupt_claim_timer, "timers"),
    ("writes in flight miscounted", corrupt_writes, "writes"),
    ("a change not applied", corrupt_changes, "changes"),
]


@pytest.mark.parametrize(("what", "corrupt", "index"), CASES, ids=[c[0] for c in CASES])
@run
async def test_each_corrupted_index_is_caught(
    what: str, corrupt: Callable[[Controller], None], index: str
) -> None:
    h = await fleet()
    corrupt(h.controller)
    found = h.controller.check_invariants()
    assert index in {v.index for v in found}, (what, found)


@run
async def test_a_resync_reports_the_difference_and_rebuilds() -> None:
    h = await fleet()
    c = h.controller
    c.strict = False
    corrupt_queue(c)
    corrupt_claims(c)
    await h.advance(c.config.resync_interval + 1)
    assert c.stats.invariant_violations >= 2
    assert not c.check_invariants(), "the resync rebuilt the indexes"
    c.strict = True
    await h.advance(1)
    assert h.phase("wait") == "Pending"
    h.renew("run")
    h.report("run", outcome="Succeeded", result={"ok": True})
    await h.settle()
    assert h.phase("wait") == "Assigned", "the rebuilt queue still dispatches"


@run
async def test_a_sampled_check_counts_violations_without_stopping_the_loop() -> None:
    h = await fleet()
    c = h.controller
    c.strict = False
    corrupt_phases(c)
    await h.advance(c.config.invariant_interval + 1)
    assert c.stats.invariant_violations == 1
    assert h.phase("run") == "Running"


@run
async def test_a_resync_compares_after_the_changes_are_applied() -> None:
    """The resync compared before the step applied the changes the watches had just
    recorded, and reported them as differences (found by the chaos run)."""
    h = await fleet()
    c = h.controller
    h.clock.advance(c.config.resync_interval + 1)
    h.task(task("late").requires("llm"))  # recorded, not yet applied
    h.renew("run")
    c.step()
    assert c.stats.invariant_violations == 0
    assert c.stats.invariant_checks >= 1
