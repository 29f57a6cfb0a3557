"""The claim decisions, pure: a typed view of a task and its Lease in, one decision out."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest

from agentq import claims, protocol, views
from agentq.claims import LeaseOp, Readiness, Seen
from agentq.models import TaskPhase
from builders import task, worker

WALL = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
POLICY = claims.Policy(max_reclaims=3, progress_interval=10)


def view(builder: Any = None, **status: Any) -> views.TaskView:
    body = (builder or task("t").requires("llm").lease(10)).namespace("ns").obj()
    body["metadata"].update(
        uid="uid-1", resourceVersion="5", creationTimestamp="2026-01-01T00:00:00Z"
    )
    body["status"] = status
    return views.task_view(body)


def running(**status: Any) -> views.TaskView:
    base = {"phase": "Running", "worker": "w1", "attempt": 1, "fencingToken": 7, "reclaims": 0}
    return view(**{**base, **status})


def lease(
    *, holder: str | None = "w1", token: str | None = "7", uid: str = "uid-1", **annotations: str
) -> views.LeaseView:
    notes = {**annotations}
    if token is not None:
        notes[protocol.ANNOTATION_TOKEN] = token
    notes[protocol.ANNOTATION_TASK_UID] = uid
    return views.lease_view(
        {
            "metadata": {
                "name": "agentq-task-t",
                "namespace": "ns",
                "resourceVersion": "9",
                "labels": {protocol.LABEL_LEASE_KIND: "task", protocol.LABEL_TASK: "t"},
                "annotations": notes,
            },
            "spec": {
                "holderIdentity": holder,
                "acquireTime": "2026-01-01T00:00:00.000000Z",
                "renewTime": "2026-01-01T00:00:01.000000Z",
                "leaseDurationSeconds": 86400,
            },
        }
    )


def seen(**fields: Any) -> Seen:
    return Seen(**{"now": 100.0, "wall": WALL, "rand": 0.5, "changed_at": 95.0, **fields})


def report(**fields: Any) -> str:
    return json.dumps({"token": 7, "worker": "w1", "outcome": "Succeeded", **fields})


def test_a_healthy_running_claim_needs_nothing_until_its_expiry() -> None:
    decision = claims.decide(running(), lease(), seen(), POLICY)
    assert decision.transition is None and decision.lease is LeaseOp.KEEP
    assert decision.wake_at == 105.0  # changed at 95 + the TASK's 10 s lease


def test_expiry_is_judged_by_the_tasks_lease_duration() -> None:
    # The Lease says 86400 s (its holder may write anything there); the task says 10.
    decision = claims.decide(running(), lease(), seen(now=105.0), POLICY)
    assert decision.transition is not None and decision.transition.phase is TaskPhase.PENDING
    assert decision.confirm_expiry and decision.lease is LeaseOp.DELETE
    assert decision.suspect == "w1"
    assert [e[0] for e in decision.transition.extra_events] == ["LeaseExpired"]


def test_no_expiry_is_judged_when_the_watches_are_not_current() -> None:
    decision = claims.decide(running(), lease(), seen(now=200.0, judgeable=False), POLICY)
    assert decision.transition is None


@pytest.mark.parametrize(
    ("policy", "expected"), [("Hold", TaskPhase.HELD), ("Redispatch", TaskPhase.PENDING)]
)
def test_on_lease_expiry_policies(policy: str, expected: TaskPhase) -> None:
    t = (
        running()
        if policy == "Redispatch"
        else view(
            task("t").lease(10).on_expiry(policy), phase="Running", worker="w1", fencingToken=7
        )
    )
    decision = claims.decide(t, lease(), seen(now=106.0), POLICY)
    assert decision.transition is not None and decision.transition.phase is expected
    if expected is TaskPhase.HELD:
        assert decision.lease is LeaseOp.KEEP  # the person who looks at it finds the Lease


def test_a_grace_period_starts_waits_and_ends() -> None:
    t = view(
        task("t").lease(10).on_expiry("GracePeriod", grace=5),
        phase="Running",
        worker="w1",
        fencingToken=7,
    )
    started = claims.decide(t, lease(), seen(now=106.0), POLICY)
    assert started.grace_deadline == 111.0 and started.transition is not None
    assert "graceUntil" in started.transition.patch
    waiting = claims.decide(t, lease(), seen(now=108.0, grace_deadline=111.0), POLICY)
    assert waiting.transition is None and waiting.wake_at == 111.0
    over = claims.decide(t, lease(), seen(now=111.0, grace_deadline=111.0), POLICY)
    assert over.transition is not None and over.transition.phase is TaskPhase.PENDING
    assert "grace period" in over.transition.message


def test_a_current_report_is_committed_and_the_lease_deleted() -> None:
    decision = claims.decide(
        running(), lease(**{protocol.ANNOTATION_REPORT: report(result={"a": 1})}), seen(), POLICY
    )
    assert decision.transition is not None and decision.transition.phase is TaskPhase.SUCCEEDED
    assert decision.lease is LeaseOp.DELETE and decision.completion == "Succeeded"


@pytest.mark.parametrize(
    "text",
    [
        report(token=6),  # a zombie's token
        report(worker="w2"),
        report(token=True),
        report(token="7"),
        report(token=7.0),
    ],
)
def test_a_report_not_from_the_current_attempt_is_refused_once(text: str) -> None:
    claim = lease(**{protocol.ANNOTATION_REPORT: text})
    decision = claims.decide(running(), claim, seen(), POLICY)
    assert decision.transition is None
    assert decision.refusal is not None
    again = claims.decide(running(), claim, seen(report_refused=True), POLICY)
    assert again.refusal is None


def test_an_unreadable_report_from_the_holder_fails_the_attempt_instead_of_wedging() -> None:
    text = report(resultRef="x" * (protocol.MAX_RESULT_REF_CHARS + 1))
    decision = claims.decide(running(), lease(**{protocol.ANNOTATION_REPORT: text}), seen(), POLICY)
    assert decision.transition is not None
    assert decision.transition.phase is TaskPhase.PENDING
    assert decision.transition.patch["error"]["reason"] == "InvalidReport"
    assert decision.lease is LeaseOp.DELETE


@pytest.mark.parametrize(
    ("holder", "token", "reason"),
    [
        ("w1", "11", "LeaseTampered"),  # raised by hand above the task's
        ("w1", "1.9", "LeaseTampered"),
        ("w1", None, "LeaseTampered"),
        ("w2", "7", "LeaseTampered"),
        (None, "7", "LeaseReleased"),
    ],
)
def test_a_lease_that_is_not_the_grant_fails_the_attempt_visibly(
    holder: str | None, token: str | None, reason: str
) -> None:
    decision = claims.decide(running(), lease(holder=holder, token=token), seen(), POLICY)
    assert decision.transition is not None
    assert decision.transition.patch["error"]["reason"] == reason
    assert decision.lease is LeaseOp.DELETE


def test_a_fencing_token_set_to_zero_by_hand_is_a_visible_failed_attempt() -> None:
    decision = claims.decide(running(fencingToken=0), lease(token="7"), seen(), POLICY)
    assert decision.transition is not None
    assert decision.transition.patch["error"]["reason"] == "LeaseTampered"


def test_a_missing_or_older_lease_is_written_never_lowered() -> None:
    assert claims.decide(running(), None, seen(), POLICY).lease is LeaseOp.WRITE_GRANT
    older = claims.decide(running(), lease(token="6", holder="w0"), seen(), POLICY)
    assert older.lease is LeaseOp.WRITE_GRANT


def test_a_lease_of_an_earlier_task_of_the_same_name_is_deleted_and_its_report_ignored() -> None:
    claim = lease(uid="uid-0", **{protocol.ANNOTATION_REPORT: report()})
    decision = claims.decide(running(), claim, seen(), POLICY)
    assert decision.transition is None and decision.lease is LeaseOp.DELETE


def test_a_task_that_cannot_be_processed_fails_visibly_once() -> None:
    payload: Any = 1
    for _ in range(300):
        payload = {"a": payload}
    t = view(task("t").payload(payload), phase="Pending")
    assert t.problem is not None and t.problem.reason == "PayloadTooDeep"
    decision = claims.decide(t, None, seen(), POLICY)
    assert decision.transition is not None and decision.transition.phase is TaskPhase.FAILED
    assert decision.unprocessable == ("AgentTask", "PayloadTooDeep")
    done = view(task("t").payload(payload), phase="Failed")
    assert claims.decide(done, None, seen(), POLICY).transition is None


def test_progress_is_copied_at_most_every_interval_and_cut_to_size() -> None:
    claim = lease(**{protocol.ANNOTATION_PROGRESS: "p" * 3000})
    first = claims.decide(running(), claim, seen(), POLICY)
    assert first.transition is not None
    assert len(first.transition.patch["progress"]) <= protocol.MAX_PROGRESS_CHARS
    soon = claims.decide(running(), claim, seen(progress_written_at=95.0), POLICY)
    assert soon.transition is None and soon.wake_at == 105.0


def test_the_progress_deadline_fails_a_renewed_attempt_that_does_not_move() -> None:
    t = view(
        task("t").lease(10).progress_deadline(20),
        phase="Running",
        worker="w1",
        fencingToken=7,
    )
    fine = claims.decide(t, lease(), seen(now=100.0, progress_changed_at=85.0), POLICY)
    assert fine.transition is None and fine.wake_at == 105.0
    stuck = claims.decide(t, lease(), seen(now=100.0, progress_changed_at=80.0), POLICY)
    assert stuck.transition is not None
    assert stuck.transition.patch["error"]["reason"] == "ProgressDeadlineExceeded"


def test_requeue_is_honoured_once_for_requeuable_phases() -> None:
    t = view(
        task("t").set("metadata.annotations", {protocol.ANNOTATION_REQUEUE: "r1"}),
        phase="DeadLettered",
    )
    decision = claims.decide(t, None, seen(), POLICY)
    assert decision.transition is not None and decision.transition.phase is TaskPhase.PENDING
    handled = view(
        task("t").set("metadata.annotations", {protocol.ANNOTATION_REQUEUE: "r1"}),
        phase="DeadLettered",
        requeueHandled="r1",
    )
    assert claims.decide(handled, None, seen(), POLICY).transition is None


def test_a_requeue_request_longer_than_status_holds_is_honoured_once() -> None:
    request = "r" * 300  # status.requeueHandled holds at most 256 characters
    t = view(
        task("t").set("metadata.annotations", {protocol.ANNOTATION_REQUEUE: request}),
        phase="DeadLettered",
    )
    decision = claims.decide(t, None, seen(), POLICY)
    assert decision.transition is not None and decision.transition.phase is TaskPhase.PENDING
    stored = decision.transition.patch["requeueHandled"]
    assert len(stored) <= 256
    # The redriven task dead-letters again, the same request still on it: not again.
    again = view(
        task("t").set("metadata.annotations", {protocol.ANNOTATION_REQUEUE: request}),
        phase="DeadLettered",
        requeueHandled=stored,
    )
    assert claims.decide(again, None, seen(), POLICY).transition is None


def test_unschedulable_names_the_missing_capabilities_and_clears() -> None:
    t = view(task("t").requires("gpu", "llm"), phase="Pending")
    message = claims.missing_capabilities(
        frozenset({"gpu", "llm"}), [frozenset({"llm"}), frozenset({"cpu"})], "ns"
    )
    assert message is not None and "gpu" in message and "llm" not in message.split("(")[0]
    set_ = claims.decide_pending(t, message, wall=WALL)
    assert set_ is not None and set_.reason == "Unschedulable"
    marked = view(task("t").requires("gpu", "llm"), **set_.apply(t.status).to_dict())
    assert claims.decide_pending(marked, message, wall=WALL) is None  # not again
    cleared = claims.decide_pending(marked, None, wall=WALL)
    assert cleared is not None
    assert cleared.patch["conditions"][-1]["status"] == "False"
    split = claims.missing_capabilities(
        frozenset({"gpu", "llm"}), [frozenset({"llm"}), frozenset({"gpu"})], "ns"
    )
    assert split is not None and "no single AgentWorker" in split


def test_worker_readiness_says_what_is_missing() -> None:
    w = views.worker_view(worker("w1", "llm").namespace("ns").obj())
    assert claims.readiness(w, None, fresh=False, unlabelled=False, suspect=False)[0] is (
        Readiness.LEASE_MISSING
    )
    reason, message = claims.readiness(w, None, fresh=False, unlabelled=True, suspect=False)
    assert reason is Readiness.LEASE_NOT_LABELLED and "agentq.dev/lease=worker" in message
    released = lease(holder=None)
    assert claims.readiness(w, released, fresh=True, unlabelled=False, suspect=False)[0] is (
        Readiness.LEASE_RELEASED
    )
    assert claims.readiness(w, lease(), fresh=False, unlabelled=False, suspect=False)[0] is (
        Readiness.LEASE_STALE
    )
    assert claims.readiness(w, lease(), fresh=True, unlabelled=False, suspect=False)[0] is (
        Readiness.READY
    )


def test_a_draining_worker_lease_keeps_claims_but_takes_no_new_task() -> None:
    """A sidecar whose pod goes away (a scale-down) marks its worker Lease draining: the
    worker is Draining (held like a paused one: claims kept, no new task), not NotReady
    (which would leave its claims to expire), and only while the Lease is fresh."""
    from agentq.models import WorkerPhase
    from agentq.operator.cores import core_spec

    w = views.worker_view(worker("w1", "llm").namespace("ns").obj())
    draining = lease(**{protocol.ANNOTATION_DRAINING: "true"})
    assert draining.draining and not lease().draining
    assert draining.fingerprint != lease().fingerprint
    reason, message = claims.readiness(w, draining, fresh=True, unlabelled=False, suspect=False)
    assert reason is Readiness.DRAINING and "no new one" in message
    assert claims.worker_phase(reason) is WorkerPhase.DRAINING
    spec = core_spec(w, (reason, message))
    assert spec is not None and spec.paused and spec.ready
    assert claims.readiness(w, draining, fresh=False, unlabelled=False, suspect=False)[0] is (
        Readiness.LEASE_STALE
    )


def test_a_worker_status_never_carries_inf_or_nan() -> None:
    w = views.worker_view(worker("w1", "llm").weight(5e-324).namespace("ns").obj())
    status = claims.worker_status(
        w,
        (Readiness.READY, "ok"),
        in_flight=1,
        in_flight_cost=1.0,
        served_cost=float("inf"),
        deficit=float("-inf"),
        tasks=frozenset({"t"}),
        stamp="2026-01-01T00:00:00Z",
    )
    json.dumps(status, allow_nan=False)  # raises on Inf / NaN


def test_token_blocks_start_above_everything_seen() -> None:
    assert claims.reserve_tokens(0, 0, 100) == (1, 100)
    assert claims.reserve_tokens(100, 40, 100) == (101, 200)
    assert claims.reserve_tokens(100, 500, 10) == (501, 510)


# -- the workers a re-dispatch avoids ---------------------------------------------------------


def _entry(worker: str | None, outcome: str, attempt: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"outcome": outcome, "attempt": attempt, "time": "2026-01-01T00:00:00Z"}
    if worker is not None:
        entry["worker"] = worker
    return entry


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        ([], frozenset()),
        ([_entry("w1", "Failed", 1)], frozenset({"w1"})),
        ([_entry("w1", "Failed", 1), _entry("w2", "Failed", 2)], frozenset({"w1", "w2"})),
        ([_entry("w1", "Held", 1), _entry(None, "Requeued", 1)], frozenset({"w1"})),
        ([_entry("w1", "Succeeded", 1), _entry(None, "Requeued", 1)], frozenset()),
        ([_entry(None, "Failed", 1)], frozenset()),
    ],
    ids=["none", "one-failure", "two-failures", "held-then-requeued", "succeeded", "no-worker"],
)
def test_a_redispatch_avoids_the_workers_of_failed_attempts(
    history: list[dict[str, Any]], expected: frozenset[str]
) -> None:
    status = view(phase="Pending", reclaims=len(history), history=history).status
    assert claims.workers_to_avoid(status) == expected
