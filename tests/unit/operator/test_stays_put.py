"""States the operator must leave alone however long it runs: a DeadLettered task is not
dispatched again, a Held task waits for a person, a task whose Lease was tampered with is
failed once, a paused worker gets nothing. On the in-memory API server with a fake clock,
"for a while" is minutes, at no cost.

Moved here from the process tests (test_operator_reclaim.py, test_operator_liveness.py,
test_ops_cli.py), which slept 2-6 s of real time after the decision to show that nothing
followed; they keep the real-process path to the decision itself.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentq import protocol
from builders import task
from harness import NS, Harness, run


def attempt(h: Harness, name: str) -> tuple[Any, ...]:
    status = h.status(name)
    return (status.get("phase"), status.get("attempt"), status.get("fencingToken"))


@pytest.mark.parametrize("outcome", ["Failed", "expired"])
@run
async def test_a_dead_lettered_task_is_never_dispatched_again(outcome: str) -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    h.worker("w2", "llm", lease_seconds=1000)
    h.task(task("poison").requires("llm").lease(3).max_reclaims(0))
    await h.settle()
    h.renew("poison")
    await h.settle()
    if outcome == "Failed":
        error = {"reason": "Boom", "message": "", "retryable": True}
        h.report("poison", outcome="Failed", error=error)
        await h.settle()
    else:
        await h.run_for(5)  # nobody renews: the only attempt's lease runs out
    assert h.phase("poison") == "DeadLettered", h.status("poison")
    dead = attempt(h, "poison")
    await h.run_for(300, step=5)
    assert attempt(h, "poison") == dead
    assert h.lease("poison") is None
    assert h.kube.reasons("poison").count("Assigned") == 1


@run
async def test_a_held_task_waits_for_a_person() -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    h.task(task("careful").requires("llm").lease(3).on_expiry("Hold"))
    await h.settle()
    h.renew("careful")
    await h.run_for(5)
    assert h.phase("careful") == "Held", h.status("careful")
    held = attempt(h, "careful")
    await h.run_for(300, step=5)
    assert attempt(h, "careful") == held
    assert h.kube.reasons("careful").count("Held") == 1


@pytest.mark.parametrize("how", ["raise-lease-token", "zero-status-token"])
@run
async def test_a_tampered_lease_fails_the_attempt_once(how: str) -> None:
    h = Harness()
    h.worker("w1", "llm", lease_seconds=1000)
    h.task(task("job").requires("llm").lease(30).max_reclaims(0))
    await h.settle()
    h.renew("job")
    await h.settle()
    token = h.status("job")["fencingToken"]
    if how == "raise-lease-token":
        h.annotate_lease("job", protocol.ANNOTATION_TOKEN, str(token + 10))
    else:
        h.kube.edit("agenttasks", NS, "job", lambda b: b["status"].__setitem__("fencingToken", 0))
    await h.settle()
    assert h.phase("job") == "DeadLettered", h.status("job")
    assert h.status("job")["error"]["reason"] == "LeaseTampered"
    done = h.status("job")
    await h.run_for(120, step=5)
    assert h.status("job") == done
    # Decided once: one reclaim, one dead letter, nothing on any pass after.
    assert h.kube.reasons("job") == ["Assigned", "Running", "Reclaimed", "DeadLettered"]


@run
async def test_a_paused_worker_gets_nothing_however_long_the_task_waits() -> None:
    h = Harness()
    h.worker("a", "llm", lease_seconds=1000)
    h.kube.edit("agentworkers", NS, "a", lambda b: b["spec"].__setitem__("paused", True))
    h.task(task("third").requires("llm"))
    await h.run_for(120, step=5)
    assert h.phase("third") == "Pending" and "worker" not in h.status("third")
    h.kube.edit("agentworkers", NS, "a", lambda b: b["spec"].__setitem__("paused", False))
    await h.settle()
    assert h.phase("third") == "Assigned"
