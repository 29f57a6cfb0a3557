"""A holder that writes ``agentq.dev/revoked`` on its own claim's Lease.

The admission policy keeps the fencing token, attempt and task UID of a task Lease as
the operator wrote them, but not the revoked annotation; and a holder may clear the
Lease's holder (let the claim go). The operator must not take a revocation it never
made for its own: the task would end Cancelled ("spec.cancel") that no one cancelled,
and a claim marked revoked is not held to its progress deadline."""

from __future__ import annotations

from agentq import protocol
from builders import task
from harness import NS, Harness, run


def forge(h: Harness, name: str, reason: str, *, release: bool) -> None:
    def change(body: dict) -> None:  # type: ignore[type-arg]
        body["metadata"].setdefault("annotations", {})[protocol.ANNOTATION_REVOKED] = reason
        if release:
            body["spec"]["holderIdentity"] = None

    h.kube.edit("leases", NS, protocol.task_lease_name(name), change)


@run
async def test_a_holder_revoking_and_releasing_its_own_claim_is_no_cancel() -> None:
    h = Harness()
    name = await h.running(task("t").requires("llm"))
    assert h.phase(name) == "Running"
    forge(h, name, protocol.REVOKE_CANCELLED, release=True)
    await h.settle()
    assert h.phase(name) != "Cancelled", h.status(name)
    assert h.condition(name, "Cancelled") is None
    assert (h.status(name).get("history") or [{}])[-1].get("reason") == "LeaseReleased"


@run
async def test_a_forged_revocation_does_not_escape_the_progress_deadline() -> None:
    h = Harness()
    name = await h.running(task("t").requires("llm").progress_deadline(30))
    forge(h, name, protocol.REVOKE_CANCELLED, release=False)
    await h.settle()
    for _ in range(40):  # renewed while it is there, never any progress
        if h.lease(name) is not None:
            h.renew(name)
        await h.advance(2)
    st = h.status(name)
    assert st.get("phase") != "Cancelled", st
    assert any(e.get("reason") == "ProgressDeadlineExceeded" for e in st.get("history") or []), st


@run
async def test_an_operator_revocation_rewritten_by_the_holder_keeps_its_reason() -> None:
    h = Harness()
    name = await h.running(task("t").requires("llm"))
    body = h.kube.get("agenttasks", NS, name)
    assert body is not None
    h.kube.edit("agenttasks", NS, name, lambda b: b["spec"].__setitem__("cancel", True))
    await h.settle()
    lease = h.lease(name)
    assert lease is not None
    assert lease["metadata"]["annotations"][protocol.ANNOTATION_REVOKED] == "Cancelled"
    forge(h, name, protocol.REVOKE_DEADLINE, release=True)
    await h.settle()
    assert h.phase(name) == "Cancelled", h.status(name)
