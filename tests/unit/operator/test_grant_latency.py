"""The slot an attempt frees is granted again without a wait of its own.

Report -> the slot's next grant is two status writes in a row (the report's commit, then
the grant that the freed slot allows) and nothing else: no write of the operator's own
bookkeeping may come between them. ``python bench/grant_bench.py`` measures the path on
the embedded control plane; docs/benchmarks.md has its figures.
"""

from __future__ import annotations

import itertools

from agentq import protocol
from agentq.operator.tokens import ANNOTATION_CEILING
from builders import task
from harness import NS, Harness, run

COUNTER = "agentq-fencing-tokens"  # OperatorConfig.token_lease


def ceiling(h: Harness) -> int:
    """The durable fencing-token counter: the highest token any block reserved."""
    lease = h.kube.get("leases", NS, COUNTER)
    assert lease is not None
    return int(lease["metadata"]["annotations"][ANNOTATION_CEILING])


async def full_worker_and_a_backlog(h: Harness, names: list[str]) -> None:
    """w1 (one slot) runs the first task; the others wait for its slot."""
    h.worker("w1", "llm", lease_seconds=1000, max_in_flight=1)
    for name in names:
        h.task(task(name).requires("llm").lease(1000).backoff(initial=0))
    await h.settle()
    h.renew(names[0])
    await h.settle()
    assert [h.phase(n) for n in names] == ["Running"] + ["Pending"] * (len(names) - 1)


@run
async def test_a_step_that_grants_nothing_takes_no_fencing_token() -> None:
    """Every step offers the queue's head to the core. The token it took for it was
    thrown away when no worker had room: in a backlog each step burnt one, a block of
    1000 ran out after a few hundred grants, and every freed slot then waited for the
    refill (a read and a write of the counter, 0.3-0.9 s on a busy API server)."""
    h = Harness(token_block=4)
    await full_worker_and_a_backlog(h, ["a", "b", "c"])
    reserved = ceiling(h)
    await h.steps(50)  # w1 is full: fifty passes over the backlog, nothing granted
    assert ceiling(h) == reserved
    assert h.controller.tokens.available == 3  # only a's token taken from the block


@run
async def test_the_freed_slot_is_granted_the_next_token_with_no_write_in_between() -> None:
    h = Harness(token_block=4)
    names = ["a", "b", "c"]
    await full_worker_and_a_backlog(h, names)
    await h.steps(50)
    for done, following in itertools.pairwise(names):
        writes = sum(h.kube.writes.values())
        h.report(done, outcome="Succeeded")
        await h.settle()
        assert h.phase(done) == "Succeeded" and h.phase(following) == "Assigned"
        assert h.status(following)["fencingToken"] == h.status(done)["fencingToken"] + 1
        # The commit, the grant, its Lease, the finished Lease's delete, two Events: no
        # write of the token counter.
        made = sum(h.kube.writes.values()) - writes
        assert made == 6, h.kube.writes
        h.renew(following)
        await h.settle()
        await h.steps(20)
    lease = h.lease("c")
    assert lease is not None
    assert lease["metadata"]["annotations"][protocol.ANNOTATION_TOKEN] == str(
        h.status("a")["fencingToken"] + 2
    )
