"""The sidecar's pure core: attempts from task Leases, the agent-gated renewal rule, and
what the agent is told. Times are plain numbers (the injected monotonic clock)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentq import protocol
from agentq.sidecar.attempts import FIRST_RENEWAL_SECONDS, AgentError, Attempt, Attempts


def lease(
    task: str = "job",
    *,
    token: int = 7,
    holder: str | None = "w",
    rv: int = 100,
    attempt: int = 1,
    uid: str = "uid-1",
    managed: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": protocol.task_lease_name(task),
        "namespace": "ns",
        "resourceVersion": str(rv),
        "labels": {protocol.LABEL_LEASE_KIND: "task", protocol.LABEL_TASK: task},
        "annotations": {
            protocol.ANNOTATION_TOKEN: str(token),
            protocol.ANNOTATION_ATTEMPT: str(attempt),
        },
        "ownerReferences": [{"kind": "AgentTask", "name": task, "uid": uid}],
    }
    if managed:
        meta["managedFields"] = [{"manager": "x"}]
    return {"metadata": meta, "spec": {"holderIdentity": holder, "leaseDurationSeconds": 30}}


def active(attempts: Attempts, now: float = 0.0, *, hb: float = 10.0, **kw: Any) -> Attempt:
    created = attempts.observe(lease(**kw), now)
    assert created is not None
    assert attempts.activate(
        created, uid="uid-1", payload={"p": 1}, lease_seconds=3 * hb, heartbeat_seconds=hb
    )
    return created


def test_a_granted_lease_becomes_an_attempt_once_its_task_is_read() -> None:
    attempts = Attempts(namespace="ns", worker="w")
    pending = attempts.observe(lease(managed=True), 5.0)
    assert pending is not None and pending.state == "pending"
    assert "managedFields" not in pending.lease["metadata"]
    assert attempts.listing() == []  # not offered before the payload is known
    with pytest.raises(AgentError) as unknown:
        attempts.find("job", 7)
    assert unknown.value.status == 404
    assert attempts.observe(lease(rv=101), 6.0) is None  # same grant: no new attempt
    assert attempts.activate(
        pending, uid="uid-1", payload={"p": 1}, lease_seconds=30, heartbeat_seconds=10
    )
    assert [a.task for a in attempts.listing()] == ["job"]
    assert pending.lease["metadata"]["resourceVersion"] == "101"  # the newest body is kept


def test_a_lease_of_an_earlier_task_with_the_same_name_is_not_served() -> None:
    attempts = Attempts(namespace="ns", worker="w")
    pending = attempts.observe(lease(uid="old"), 0.0)
    assert pending is not None
    assert not attempts.activate(
        pending, uid="new", payload=None, lease_seconds=30, heartbeat_seconds=10
    )
    assert attempts.listing() == []


def test_the_first_beat_renews_at_once_then_every_heartbeat_interval_while_beating() -> None:
    attempts = Attempts(namespace="ns", worker="w")
    a = active(attempts, 0.0, hb=10.0)
    assert a.due_at() is None  # no beat yet: nothing to renew (the grant is fresh)
    attempts.beat("job", 7, "p1", 2.0)
    assert a.due_at() == 2.0  # the first beat: renew now (the attempt is Running)
    attempts.renewed(a, lease(rv=101), 2.0)
    attempts.beat("job", 7, None, 3.0)
    assert a.due_at() == 12.0  # next on the cadence
    assert a.progress == "p1"  # a beat without progress keeps the marker
    attempts.beat("job", 7, None, 11.5)
    assert attempts.due(11.9) == [] and attempts.due(12.0) == [a]


def test_a_hung_agent_gets_no_renewal_and_a_late_beat_renews_at_once() -> None:
    attempts = Attempts(namespace="ns", worker="w")
    a = active(attempts, 0.0, hb=10.0)
    attempts.beat("job", 7, None, 1.0)
    attempts.renewed(a, lease(rv=101), 1.0)
    attempts.beat("job", 7, None, 1.5)  # then the agent hangs
    assert a.due_at() == 11.0  # the beat at 1.5 is still fresh at 11.0
    attempts.renewed(a, lease(rv=102), 11.0)
    assert a.due_at() is None  # the last beat (1.5) is too old for the renewal at 21.0
    assert a.expires_at == 11.0 + 30.0
    attempts.beat("job", 7, None, 25.0)  # it comes back: overdue, so renew now
    assert a.due_at() == 25.0


def test_a_failed_write_is_retried_but_not_before_retry_at() -> None:
    attempts = Attempts(namespace="ns", worker="w")
    a = active(attempts, 0.0)
    attempts.beat("job", 7, None, 1.0)
    attempts.write_failed(a, 1.0, retry_in=0.5)
    assert a.due_at() == 1.5
    a.writes = 1
    assert a.due_at() is None  # one write at a time


@settings(max_examples=200)
@given(
    beats=st.lists(st.floats(min_value=0, max_value=200, allow_nan=False), max_size=40),
    hb=st.sampled_from([1.0, 3.0, 10.0]),
)
def test_renewals_happen_only_after_a_fresh_beat_and_at_most_once_per_interval(
    beats: list[float], hb: float
) -> None:
    """Simulate the loop: whatever the beats, every renewal has a beat within one heartbeat
    interval before it, and renewals are at least one interval apart (except the first)."""
    attempts = Attempts(namespace="ns", worker="w")
    a = active(attempts, 0.0, hb=hb)
    beats = sorted(beats)
    renewals: list[float] = []
    now, i = 0.0, 0
    while now <= 210:
        while i < len(beats) and beats[i] <= now:
            attempts.beat("job", 7, None, beats[i])
            i += 1
        if attempts.due(now):
            renewals.append(now)
            attempts.renewed(a, lease(), now)
        now = round(now + 0.25, 2)
    for r in renewals:
        assert any(r - hb <= b <= r for b in beats), (r, beats)
    for earlier, later in itertools.pairwise(renewals):
        assert later - earlier >= hb - 1e-9
    if beats and beats[0] <= 200:
        # The first beat renews at once, or a short while after the grant (at 0) if sooner.
        first = max(beats[0], min(FIRST_RENEWAL_SECONDS, hb / 2))
        assert renewals and renewals[0] <= first + 0.25


def test_what_the_agent_is_told_for_stale_lost_and_unknown_tokens() -> None:
    attempts = Attempts(namespace="ns", worker="w")
    active(attempts, 0.0, token=7)
    with pytest.raises(AgentError) as forged:
        attempts.find("job", 8)
    assert (forged.value.status, forged.value.code) == (409, "StaleToken")
    assert forged.value.details["currentToken"] == 7
    with pytest.raises(AgentError) as nobody:
        attempts.find("other", 7)
    assert (nobody.value.status, nobody.value.code) == (404, "UnknownTask")
    # Re-granted (a newer token for the same task): the old attempt is lost, the new one live.
    newer = attempts.observe(lease(token=9, rv=120), 1.0)
    assert newer is not None
    with pytest.raises(AgentError) as lost:
        attempts.find("job", 7)
    assert (lost.value.status, lost.value.code) == (409, "LeaseLost")
    assert "granted again with token 9" in lost.value.message
    # An old event of the earlier grant changes nothing.
    assert attempts.observe(lease(token=7, rv=90), 2.0) is None
    assert attempts.current["job"] is newer


def test_a_deleted_or_handed_over_lease_ends_the_attempt() -> None:
    attempts = Attempts(namespace="ns", worker="w")
    a = active(attempts, 0.0)
    attempts.observe(lease(holder="other", rv=150), 1.0)
    assert "job" not in attempts.current
    with pytest.raises(AgentError) as lost:
        attempts.find("job", a.token)
    assert "held by other" in lost.value.message
    b = active(attempts, 2.0, token=11, rv=200)
    attempts.reported(b, lease(token=11, rv=201), '{"r":1}', 3.0)
    attempts.deleted(lease(token=11, rv=202))
    with pytest.raises(AgentError) as over:
        attempts.find("job", 11)
    assert over.value.code == "AttemptEnded"
    assert attempts.ended_report("job", 11) == '{"r":1}'


def test_a_resync_ends_what_is_gone_and_finds_what_is_new() -> None:
    attempts = Attempts(namespace="ns", worker="w")
    active(attempts, 0.0, task="gone")
    new = attempts.resync([lease(task="fresh", rv=300)], 5.0)
    assert [n.task for n in new] == ["fresh"]
    assert "gone" not in attempts.current


def test_leases_from_before_a_takeover_are_not_served() -> None:
    attempts = Attempts(namespace="ns", worker="w")
    assert attempts.observe(lease(token=5, rv=100), 0.0, serve_from_rv=150) is None
    with pytest.raises(AgentError) as inherited:
        attempts.find("job", 5)
    assert inherited.value.code == "LeaseLost" and "took the worker Lease over" in (
        inherited.value.message
    )
    # Granted again after the takeover (newer token, newer version): ours.
    assert attempts.observe(lease(token=6, rv=160), 1.0, serve_from_rv=150) is not None


def test_describe_gives_the_agent_its_deadline_and_interval() -> None:
    import datetime

    attempts = Attempts(namespace="ns", worker="w")
    a = active(attempts, 100.0, hb=10.0)
    wall = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    described = a.describe(110.0, wall)
    assert described["leaseRemainingSeconds"] == 20.0  # seen at 100, 30 s lease
    assert described["leaseDeadline"] == "2026-01-01T00:00:20.000000Z"
    assert described["heartbeatIntervalSeconds"] == 10.0
    assert described["token"] == 7 and described["payload"] == {"p": 1}
    assert described["worker"] == "w" and described["state"] == "active"


def revoked_lease(reason: str = "Cancelled", **kw: Any) -> dict[str, Any]:
    body = lease(**kw)
    body["metadata"]["annotations"][protocol.ANNOTATION_REVOKED] = reason
    return body


def test_a_revoked_claim_is_renewed_no_more_offered_to_no_one_and_told_to_its_agent() -> None:
    attempts = Attempts(namespace="ns", worker="w")
    attempt = active(attempts)
    attempts.beat("job", 7, None, 1.0)
    assert attempt.due_at() is not None
    assert attempts.releasable() == [], "the agent beat for it: it is told first"
    attempts.observe(revoked_lease(rv=101), 2.0)
    assert attempt.due_at() is None, "renewed no more"
    assert attempts.listing() == []
    assert attempts.releasable() == []
    with pytest.raises(AgentError) as told:
        attempts.beat("job", 7, None, 3.0)
    err = told.value
    assert (err.status, err.code) == (409, "Cancelled")
    assert err.body()["fenceToken"] == 8
    assert attempts.releasable() == [attempt]
    attempts.released(attempt)
    with pytest.raises(AgentError) as again:
        attempts.find("job", 7)
    assert (again.value.status, again.value.code) == (409, "Cancelled")


def test_a_revoked_claim_its_agent_never_beat_for_is_let_go_at_once() -> None:
    attempts = Attempts(namespace="ns", worker="w")
    attempt = active(attempts)
    attempts.observe(revoked_lease("DeadlineExceeded", rv=101), 1.0)
    assert attempts.releasable() == [attempt]
    with pytest.raises(AgentError) as told:
        attempts.find("job", 7)
    assert told.value.code == "DeadlineExceeded"


def test_a_grant_seen_already_revoked_is_never_offered() -> None:
    attempts = Attempts(namespace="ns", worker="w")
    pending = attempts.observe(revoked_lease(), 0.0)
    assert pending is not None
    attempts.activate(pending, uid="uid-1", payload=None, lease_seconds=30, heartbeat_seconds=10)
    assert attempts.listing() == [] and attempts.releasable() == [pending]


def test_an_unknown_revoke_reason_reads_as_cancelled() -> None:
    attempts = Attempts(namespace="ns", worker="w")
    active(attempts)
    attempts.observe(revoked_lease("because", rv=101), 1.0)
    with pytest.raises(AgentError) as told:
        attempts.find("job", 7)
    assert told.value.code == "Cancelled"


def test_an_agent_that_reports_soon_after_its_grant_writes_only_its_report() -> None:
    attempts = Attempts(namespace="ns", worker="w")
    a = active(attempts, 0.0, hb=10.0)
    attempts.beat("job", 7, None, 0.1)
    assert a.due_at() == 1.0, "not at the first beat: a short while after the grant"
    assert attempts.due(0.5) == []
    attempts.reported(a, lease(rv=101), '{"outcome": "Succeeded"}', 0.5)
    assert a.due_at() is None, "reported: its renewal is the report's write"
    b = active(Attempts(namespace="ns", worker="w"), 0.0, hb=1.0)
    b.beat_at = 0.1
    assert b.due_at() == 0.5, "at most half the heartbeat interval after the grant"


def test_offered_moves_only_for_what_the_agent_did_not_do_itself() -> None:
    """``offered`` (what ``?until=offers`` long polls wait on) moves when an attempt is
    offered or withdrawn before its report, not at a report or the end that follows
    it, nor for a grant that was never offered."""
    attempts = Attempts(namespace="ns", worker="w")
    attempt = active(attempts)
    assert attempts.offered == attempts.version, "offered"
    before = attempts.offered
    attempts.beat("job", 7, None, 1.0)
    attempts.reported(attempt, lease(rv=101), "report", 1.0)
    attempts.deleted(lease(rv=102))
    assert attempts.offered == before and attempts.version == before + 2
    active(attempts, task="lost", token=8)
    attempts.deleted(lease("lost", token=8, rv=103))
    assert attempts.offered == attempts.version, "withdrawn: lost before its report"
    active(attempts, task="cancelled", token=9)
    attempts.observe(revoked_lease(task="cancelled", token=9, rv=104), 2.0)
    assert attempts.offered == attempts.version, "withdrawn: revoked"
    before = attempts.offered
    with pytest.raises(AgentError):
        attempts.find("cancelled", 9)  # told
    attempts.released(attempts.current["cancelled"])
    pending = attempts.observe(revoked_lease(task="never", token=10), 3.0)
    assert pending is not None
    attempts.activate(pending, uid="uid-1", payload=None, lease_seconds=30, heartbeat_seconds=10)
    assert attempts.offered == before, "a revoked claim was never offered nor withdrawn"
