"""A worker whose Lease stops being renewed is NotReady once the Lease's duration passes.

Found by CI: the operator's Lease and AgentWorker watches start together, and when
the worker Lease was seen before its AgentWorker, no staleness timer was set for it
(the Lease's event found no worker to time; the worker's event set none). A sidecar
killed before its next renewal then left the worker Ready for good, and tasks went on
being granted to it.
"""

from __future__ import annotations

from agentq.claims import Readiness
from harness import Harness, run


@run
async def test_a_lease_seen_before_its_worker_still_goes_stale() -> None:
    h = Harness()
    h.worker_lease("w", seconds=3)  # the sidecar's Lease first...
    await h.settle()
    h.worker("w", "llm", lease=False)  # ...then the AgentWorker
    await h.settle()
    assert h.readiness("w") is Readiness.READY
    await h.advance(3.5)  # nothing renews it
    assert h.readiness("w") is Readiness.LEASE_STALE
    assert h.worker_status("w")["phase"] == "NotReady"


@run
async def test_a_worker_seen_before_its_lease_goes_stale() -> None:
    h = Harness()
    h.worker("w", "llm", lease=False)
    await h.settle()
    h.worker_lease("w", seconds=3)
    await h.settle()
    assert h.readiness("w") is Readiness.READY
    await h.advance(3.5)
    assert h.readiness("w") is Readiness.LEASE_STALE
    assert h.worker_status("w")["phase"] == "NotReady"
