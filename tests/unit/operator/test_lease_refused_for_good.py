"""Lease writes the API server refuses for good must not leave a claim without an end:
a revoke mark refused (422: the holder filled its Lease's annotations to the limit)
must not let the claim run for as long as its holder renews, and a grant's Lease
refused in the task's own namespace must not hold the worker's slot for good."""

from __future__ import annotations

from agentq import protocol
from agentq.operator.port import Status
from builders import task
from harness import NS, Harness, run


def cancel(h: Harness, name: str) -> None:
    h.kube.edit("agenttasks", NS, name, lambda b: b["spec"].__setitem__("cancel", True))


@run
async def test_a_cancel_whose_revoke_is_refused_ends_the_claim_at_once() -> None:
    h = Harness()
    name = await h.running(task("t").requires("llm").lease(30))
    token = h.status(name)["fencingToken"]
    h.kube.inject("patch_lease", Status.INVALID, times=100)
    cancel(h, name)
    await h.settle()
    await h.advance(1)  # far less than the 30 s lease: the holder is still renewing
    if h.lease(name) is not None:
        h.renew(name)
    await h.settle()
    st = h.status(name)
    assert st["phase"] == "Cancelled", st
    assert st["history"][-1]["token"] == token
    assert h.lease(name) is None  # deleted: the holder loses it
    assert "RevokeRefused" in h.kube.reasons(name)


@run
async def test_a_deadline_whose_revoke_is_refused_ends_the_claim_failed() -> None:
    h = Harness()
    name = await h.running(task("t").requires("llm").lease(30).deadline(5))
    h.kube.inject("patch_lease", Status.INVALID, times=100)
    for _ in range(8):
        if h.lease(name) is not None:
            h.renew(name)
        await h.advance(1)
    st = h.status(name)
    assert st["phase"] == "Failed", st
    assert (st.get("error") or {}).get("reason") == "DeadlineExceeded", st
    assert h.lease(name) is None
    assert "RevokeRefused" in h.kube.reasons(name)


@run
async def test_a_revoke_that_lands_keeps_the_holder_told_cancelled() -> None:
    h = Harness()
    name = await h.running(task("t").requires("llm").lease(30))
    cancel(h, name)
    await h.settle()
    lease = h.lease(name)
    assert lease is not None
    assert lease["metadata"]["annotations"][protocol.ANNOTATION_REVOKED] == "Cancelled"
    assert h.phase(name) == "Running"  # until its holder lets go
    assert "RevokeRefused" not in h.kube.reasons(name)


@run
async def test_a_grant_lease_refused_in_the_task_namespace_ends_the_attempt() -> None:
    # An admission policy or a body the API server will not take (403, 422) in the task's
    # own namespace: the claim would hold its worker's slot with nothing to expire.
    for refusal in (Status.FORBIDDEN, Status.INVALID):
        h = Harness()
        h.worker("w1", "llm", lease_seconds=1000)
        h.kube.inject("create_lease", refusal, times=10_000, when=lambda a: "task" in str(a[1]))
        h.task(task("t").requires("llm").lease(10))
        await h.settle()
        assert h.phase("t") == "Assigned"
        await h.run_for(12, step=1)
        st = h.status("t")
        assert st["reclaims"] >= 1, (refusal, st)
        assert st["history"][0]["reason"] == "LeaseUnwritable", (refusal, st)
        assert "LeaseUnwritable" in h.kube.reasons("t")
