"""A worker Lease that exists without the label the watch selects on is named as such.

The watch cannot see such a Lease, so the operator reads it directly, at most every
``DIAGNOSE_SECONDS`` per worker. Found by the bad-input corpus: when the label went
away within that interval of an earlier read, the next read was never scheduled and
the Ready condition said "missing" for good.
"""

from __future__ import annotations

from agentq import protocol
from agentq.operator.readiness import DIAGNOSE_SECONDS
from harness import NS, Harness, run


def ready_message(h: Harness, worker: str) -> str:
    conditions = h.worker_status(worker).get("conditions") or []
    ready = next((c for c in conditions if c["type"] == "Ready"), {})
    return str(ready.get("message", ""))


@run
async def test_a_label_removed_soon_after_an_earlier_read_is_still_diagnosed() -> None:
    h = Harness()
    h.worker("w", "llm", lease_seconds=10)
    await h.settle()
    lease = protocol.worker_lease_name("w")
    h.kube.remove("leases", NS, lease)  # gone: read directly, found missing
    await h.advance(1)
    assert h.worker_status("w")["phase"] == "NotReady"
    await h.advance(4)
    h.worker_lease("w", seconds=10)  # back, labelled: Ready again
    await h.advance(1)
    assert h.worker_status("w")["phase"] == "Ready"
    # A moment later someone drops the label the watch selects on.
    h.kube.edit(
        "leases", NS, lease, lambda b: b["metadata"]["labels"].pop(protocol.LABEL_LEASE_KIND)
    )
    await h.run_for(DIAGNOSE_SECONDS + 5)
    message = ready_message(h, "w")
    assert h.worker_status("w")["phase"] == "NotReady"
    assert lease in message and protocol.LABEL_LEASE_KIND in message, message
