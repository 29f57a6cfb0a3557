"""A re-dispatch prefers another worker (docs/scheduling.md, "The avoid set"), on the
in-memory API server.

The worker whose claim expired is ineligible only until its worker Lease is renewed
again; when its pod is replaced at once (a Deployment's new pod renews the worker Lease
within a second) that guard is gone before the task is dispatched again. The task's
avoid set (the workers of its failed attempts) is what keeps it away.
"""

from __future__ import annotations

from builders import task
from harness import Harness, run


async def _running(h: Harness, name: str) -> str:
    await h.settle()
    h.renew(name)
    await h.settle()
    assert h.phase(name) == "Running"
    worker: str = h.status(name)["worker"]
    return worker


@run
async def test_a_reclaimed_task_goes_to_another_worker_even_if_its_worker_came_back_at_once() -> (
    None
):
    h = Harness()
    # "fast" is the DRR choice for every task here: it has ten times the weight, and "slow"
    # already holds work. Without a preference the reclaimed task would go straight back.
    h.worker("fast", "llm", weight=10.0, lease_seconds=1000)
    h.worker("slow", "llm", weight=1.0, lease_seconds=1000)
    for i in range(2):
        h.task(task(f"busy{i}").requires("llm").lease(1000))
    await h.settle()
    # A retry backoff of 1 s: the worker's replacement pod renews its worker Lease before
    # the task may be dispatched again, so the "suspect" guard is gone by then.
    h.task(task("job").requires("llm").lease(3).backoff(initial=1, jitter=0))
    first = await _running(h, "job")
    assert first == "fast"
    # The holder dies; its worker Lease goes on being renewed (its replacement pod).
    for _ in range(12):
        await h.advance(0.5)
        h.renew_worker("fast")
        h.renew_worker("slow")
        await h.settle()
    status = h.status("job")
    assert status["reclaims"] == 1, status
    assert status["history"][-1]["worker"] == "fast"
    assert status["history"][-1]["reason"] == "LeaseExpired"
    assert status["worker"] == "slow", "the re-dispatch went back to the worker that failed"


@run
async def test_a_reclaimed_task_goes_back_to_its_worker_when_no_other_can_take_it() -> None:
    h = Harness()
    h.worker("only", "gpu", lease_seconds=1000)
    h.worker("other", "llm", lease_seconds=1000)  # cannot take a gpu task
    h.task(task("job").requires("gpu").lease(3).backoff(initial=1, jitter=0))
    assert await _running(h, "job") == "only"
    for _ in range(12):
        await h.advance(0.5)
        h.renew_worker("only")
        await h.settle()
    status = h.status("job")
    assert status["reclaims"] == 1
    assert status["worker"] == "only", "an avoid set must never leave a task pending"
    assert status["attempt"] == 2
