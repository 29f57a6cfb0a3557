"""``agentq explain``'s reasoning: one test per "why it is where it is" case."""

from __future__ import annotations

import json

import pytest

from agentq import protocol
from agentq.clock import micro_rfc3339
from agentq.models import RetryBackoff
from agentq.ops.explain import (
    Explanation,
    explain,
    human_seconds,
    parse_workers,
    pending_ahead,
)
from opsdata import NOW, Story, at, event, task, worker

pytestmark = pytest.mark.unit


def why(body: dict, workers: list[dict] = (), events: list[dict] = (), **kw: object) -> Explanation:
    return explain(body, workers=list(workers), events=list(events), lease=None, now=NOW, **kw)


def finding(exp: Explanation, code: str) -> str:
    found = [f for f in exp.findings if f.code == code]
    assert found, f"no {code} in {exp.codes}"
    return found[0].message


# --- Pending: where could it go? ------------------------------------------------------------


def test_a_task_without_status_is_not_seen_yet_and_still_placed() -> None:
    exp = why(task(), [worker("w", "llm")])
    assert exp.codes == ["NotSeenYet", "DispatchDue"]
    assert exp.phase == "(none)"


def test_no_workers_at_all_is_unschedulable() -> None:
    exp = why(task(status={"phase": "Pending"}))
    assert exp.codes == ["Unschedulable"]
    assert "no AgentWorkers in namespace agents" in finding(exp, "Unschedulable")


def test_unschedulable_names_only_the_capabilities_nobody_offers() -> None:
    body = task(requires=("gpu", "llm", "quantum"), status={"phase": "Pending"})
    exp = why(body, [worker("a", "llm"), worker("b", "gpu", "llm")])
    message = finding(exp, "Unschedulable")
    assert "offers quantum (it requires gpu, llm, quantum)" in message
    assert exp.findings[0].hint and "spec.capabilities" in exp.findings[0].hint


def test_capabilities_split_across_workers_say_what_each_lacks() -> None:
    body = task(requires=("gpu", "llm"), status={"phase": "Pending"})
    exp = why(body, [worker("cpu-box", "llm"), worker("gpu-box", "gpu"), worker("x", "other")])
    message = finding(exp, "Unschedulable")
    assert "no single worker offers them all" in message
    assert "cpu-box lacks gpu" in message and "gpu-box lacks llm" in message


def test_capable_workers_that_are_not_ready_or_paused_each_say_why() -> None:
    body = task(status={"phase": "Pending"})
    workers = [
        worker("down", "llm", phase="NotReady", ready_message="the worker Lease is not renewed"),
        worker("drained", "llm", phase="Draining", paused=True),
        worker("new", "llm", phase=None),
        worker("other", "gpu"),  # Ready, but cannot take it: not mentioned
    ]
    exp = why(body, workers)
    assert exp.codes == ["NoReadyWorker"]
    message = finding(exp, "NoReadyWorker")
    assert message.startswith("3 worker(s) could take it")
    assert "down: NotReady: the worker Lease is not renewed" in message
    assert protocol.worker_lease_name("down") in message
    assert "drained: paused" in message and "agentq uncordon drained -n agents" in message
    assert "new: not seen by the operator yet" in message
    assert "other" not in message


def test_full_workers_give_no_free_capacity_with_the_queue_ahead() -> None:
    body = task(status={"phase": "Pending"})
    workers = [
        worker("a", "llm", in_flight=2, max_in_flight=2),
        worker("b", "llm", "gpu", in_flight=1, max_in_flight=1),
    ]
    exp = why(body, workers, pending_ahead=4)
    message = finding(exp, "NoFreeCapacity")
    assert "(a 2/2, b 1/1)" in message
    assert "4 Pending task(s) ahead of it (by priority, then age)" in message


def test_a_free_slot_means_the_next_pass_dispatches_it() -> None:
    body = task(status={"phase": "Pending"})
    exp = why(body, [worker("a", "llm", in_flight=2, max_in_flight=2), worker("b", "llm")])
    assert exp.codes == ["DispatchDue"]
    assert "b 0/1" in finding(exp, "DispatchDue")
    assert exp.findings[0].hint and "agentq_leader" in exp.findings[0].hint


def test_a_failed_attempt_waits_out_its_backoff_until_not_before() -> None:
    story = Story().grant("w", -20).start(-19)
    story.fail(-5, "AgentError", backoff=RetryBackoff(initial_seconds=65, jitter=0))
    body = task(status=story.status)
    exp = why(body, [worker("w", "llm")])
    assert exp.codes == ["BackoffWait", "DispatchDue"]
    message = finding(exp, "BackoffWait")
    assert "until 2026-01-01T12:01:00Z (1m00s from now)" in message
    assert "after failed attempt 1 (AgentError: AgentError happened)" in message
    # Once notBefore has passed, it is an ordinary Pending task.
    later = explain(body, workers=[worker("w", "llm")], events=[], lease=None, now=at(61))
    assert later.codes == ["DispatchDue"]


def test_pending_ahead_counts_older_pending_tasks_the_same_workers_could_take() -> None:
    me = task("me", created=-10, status={"phase": "Pending"})
    others = [
        task("older-llm", created=-20, status={"phase": "Pending"}),
        task("older-gpu", requires=("gpu",), created=-20, status={"phase": "Pending"}),
        task("older-new", created=-30),  # no status yet: pending too
        task("older-running", created=-20, status={"phase": "Running"}),
        task("younger", created=-5, status={"phase": "Pending"}),
        task("a-same-second", created=-10, status={"phase": "Pending"}),  # name sorts first
    ]
    workers = parse_workers([worker("w", "llm")])
    assert pending_ahead(me, [me, *others], workers) == 3


def test_pending_ahead_goes_by_priority_then_age() -> None:
    # The operator grants by spec.priority first (docs/tenancy.md, "Priorities"): an older
    # task of a lower priority is behind, a younger one of a higher priority ahead.
    me = task("me", created=-10, status={"phase": "Pending"}, priority=5)
    others = [
        task("older-lower", created=-20, status={"phase": "Pending"}),
        task("oldest-negative", created=-30, status={"phase": "Pending"}, priority=-1),
        task("younger-higher", created=-5, status={"phase": "Pending"}, priority=6),
        task("older-same", created=-20, status={"phase": "Pending"}, priority=5),
        task("younger-same", created=-5, status={"phase": "Pending"}, priority=5),
    ]
    workers = parse_workers([worker("w", "llm")])
    assert pending_ahead(me, [me, *others], workers) == 2


def test_a_task_with_a_payload_too_deep_to_parse_is_skipped_not_a_crash() -> None:
    # The API server accepts payloads thousands of levels deep (the operator fails them
    # PayloadTooDeep); explaining any other task of the namespace must still work.
    payload: dict[str, object] = {}
    node = payload
    for _ in range(3000):
        node["a"] = {}
        node = node["a"]  # type: ignore[assignment]
    deep = task("deep", created=-20, status={"phase": "Pending"}, payload=payload)
    me = task("me", created=-10, status={"phase": "Pending"})
    older = task("older", created=-20, status={"phase": "Pending"})
    workers = parse_workers([worker("w", "llm")])
    assert pending_ahead(me, [me, deep, older], workers) == 1


# --- holding a claim ---------------------------------------------------------------------


def test_assigned_waits_for_the_first_renewal_and_flags_a_not_ready_holder() -> None:
    story = Story().grant("w", -4)
    exp = why(task(status=story.status), [worker("w", "llm", phase="NotReady")])
    assert exp.codes == ["AwaitingStart", "WorkerNotReady"]
    message = finding(exp, "AwaitingStart")
    assert "assigned to w (attempt 1, fencing token 1)" in message
    assert "expires after 30s and onLeaseExpiry=Redispatch applies" in message


def test_a_holder_that_was_deleted_is_flagged() -> None:
    story = Story().grant("gone", -4).start(-3)
    exp = why(task(status=story.status), [])
    assert "WorkerNotReady" in exp.codes
    assert "no longer exists" in finding(exp, "WorkerNotReady")


def test_running_shows_renewal_progress_and_deadline() -> None:
    story = Story().grant("w", -100).start(-99)
    story.status["progress"] = "step-7"
    lease = {
        "metadata": {"annotations": {protocol.ANNOTATION_TOKEN: "1"}},
        "spec": {"holderIdentity": "w", "renewTime": micro_rfc3339(at(-3))},
    }
    body = task(status=story.status, progressDeadlineSeconds=60)
    exp = explain(body, workers=[worker("w", "llm")], events=[], lease=lease, now=NOW)
    assert exp.codes == ["Running"]
    message = finding(exp, "Running")
    assert "running on w since 2026-01-01T11:58:21Z" in message
    assert "last renewed 3.0s ago" in message
    assert 'last progress "step-7"' in message
    assert "reclaimed if progress stalls for 60s" in message


def test_a_report_waiting_on_the_lease_is_mentioned() -> None:
    story = Story().grant("w", -10).start(-9)
    report = protocol.Report(token=1, worker="w", outcome="Succeeded").encode()
    lease = {"metadata": {"annotations": {protocol.ANNOTATION_REPORT: report}}, "spec": {}}
    exp = explain(
        task(status=story.status), workers=[worker("w", "llm")], events=[], lease=lease, now=NOW
    )
    assert "a report is on the Lease, waiting for the operator" in finding(exp, "Running")


def test_an_expired_lease_in_its_grace_period() -> None:
    story = Story().grant("w", -60).start(-59).grace(until=20, when=-10)
    body = task(status=story.status, onLeaseExpiry="GracePeriod", gracePeriodSeconds=30)
    exp = why(body, [worker("w", "llm")])
    assert exp.codes == ["Running", "GracePeriod"]
    assert "accepted until 2026-01-01T12:00:20Z" in finding(exp, "GracePeriod")


# --- ended, or waiting for a person ------------------------------------------------------


def test_held_says_a_person_decides_and_how() -> None:
    story = Story().grant("w", -60).start(-59).hold(-30)
    exp = why(task(status=story.status, onLeaseExpiry="Hold"), [worker("w", "llm")])
    assert exp.codes == ["Held"]
    assert "onLeaseExpiry is Hold" in finding(exp, "Held")
    assert exp.findings[0].hint == "look at w's agent, then `agentq requeue job -n agents`"


def test_dead_lettered_tallies_the_failures_since_the_last_requeue() -> None:
    story = Story()
    story.grant("a", -100).fail(-90, "AgentError", max_reclaims=2)
    story.grant("a", -89).fail(-80, "AgentError", max_reclaims=2)
    story.grant("b", -79).fail(-70, "AgentError", max_reclaims=2)
    assert story.status["phase"] == "DeadLettered"
    story.requeue(-60)
    story.grant("a", -50).fail(-45, "LeaseExpired", max_reclaims=2)
    story.grant("b", -40).fail(-35, "LeaseExpired", max_reclaims=2)
    story.grant("c", -30).fail(-20, "ProgressDeadlineExceeded", max_reclaims=2)
    body = task(status=story.status, maxReclaims=2)
    exp = why(body, [worker("a", "llm")])
    assert exp.codes == ["DeadLettered"]
    message = finding(exp, "DeadLettered")
    assert "after 3 failed attempts, more than maxReclaims=2 allows" in message
    assert "(LeaseExpired x2, ProgressDeadlineExceeded x1)" in message
    assert "AgentError" not in message.split("last error")[0]
    assert exp.findings[0].hint == "fix the cause, then `agentq requeue job -n agents`"


def test_dead_lettered_without_max_reclaims_names_the_operator_default() -> None:
    story = Story().grant("a", -10).fail(-5, "AgentError", max_reclaims=0)
    exp = why(task(status=story.status), [])
    assert "the operator's MAX_RECLAIMS" in finding(exp, "DeadLettered")


def test_failed_shows_the_non_retryable_error() -> None:
    story = Story().grant("w", -10).start(-9).fail_terminal(-5)
    exp = why(task(status=story.status), [worker("w", "llm")])
    assert exp.codes == ["Failed"]
    assert "w reported a non-retryable failure" in finding(exp, "Failed")
    assert "BadInput: no such file" in finding(exp, "Failed")


def test_succeeded() -> None:
    story = Story().grant("w", -10).start(-9).succeed(-5)
    exp = why(task(status=story.status), [worker("w", "llm")])
    assert exp.codes == ["Succeeded"]
    assert "succeeded on w at 2026-01-01T11:59:55Z (5.0s ago) in attempt 1" in finding(
        exp, "Succeeded"
    )


# --- across phases -------------------------------------------------------------------------


def test_refused_zombie_reports_are_counted_and_quoted() -> None:
    story = Story().grant("a", -60).start(-59).fail(-40).grant("b", -39).start(-38)
    refused = event(
        "StaleReportRefused",
        "refused a Succeeded report from a with token 1: the current attempt is 2 on b",
        -10,
        kind="Warning",
        count=2,
    )
    exp = why(task(status=story.status), [worker("b", "llm")], [*story.events, refused])
    assert exp.codes == ["Running", "ReportsRefused"]
    message = finding(exp, "ReportsRefused")
    assert message.startswith("2 report(s) from a holder that no longer owned the claim")
    assert "from a with token 1" in message


def test_a_refusal_of_the_report_that_was_committed_is_an_echo_not_a_zombie() -> None:
    story = Story().grant("w", -10).start(-9).succeed(-5)
    echo = event(
        "StaleReportRefused",
        "refused a Succeeded report from w with token 1: the current attempt is 1 on w with "
        "token 1 (phase Succeeded)",
        -5,
        kind="Warning",
    )
    assert why(task(status=story.status), [worker("w", "llm")], [echo]).codes == ["Succeeded"]
    # The same worker's report for an attempt that expired is a zombie's.
    expired = Story().grant("w", -30).start(-29).fail(-20).grant("v", -19).start(-18)
    zombie = event("StaleReportRefused", echo["message"], -5, kind="Warning")
    assert "ReportsRefused" in why(task(status=expired.status), [], [zombie]).codes
    # A refusal that does not say who is counted.
    vague = event("StaleReportRefused", "unreadable report annotation: ...", -5, kind="Warning")
    assert "ReportsRefused" in why(task(status=story.status), [], [vague]).codes


def test_a_requeue_the_operator_has_not_honoured_yet() -> None:
    story = Story().grant("a", -10).fail(-5, max_reclaims=0)
    waiting = task(status=story.status, annotations={protocol.ANNOTATION_REQUEUE: "r9"})
    assert why(waiting).codes[0] == "RequeueRequested"
    story.requeue(-1, request="r9")
    honoured = task(status=story.status, annotations={protocol.ANNOTATION_REQUEUE: "r9"})
    assert "RequeueRequested" not in why(honoured).codes


# --- the timeline ------------------------------------------------------------------------------


def test_the_timeline_has_each_attempt_with_its_worker_token_and_duration() -> None:
    story = Story()
    story.grant("a", -100).start(-99).fail(-70, "LeaseExpired", max_reclaims=1)
    story.grant("b", -65).start(-64).fail(-60, "AgentError", max_reclaims=1)
    story.requeue(-50)
    story.grant("c", -40).start(-39)
    exp = why(task(status=story.status), [worker("c", "llm")], story.events)
    rows = [(r.attempt, r.worker, r.token, r.outcome, r.reason) for r in exp.timeline]
    assert rows == [
        (1, "a", 1, "Failed", "LeaseExpired"),
        (2, "b", 2, "Failed", "AgentError"),
        (2, None, 2, "Requeued", "Requeued"),
        (3, "c", 3, "Running", None),
    ]
    durations = [r.duration(NOW) for r in exp.timeline]
    assert durations == [30.0, 5.0, None, 40.0]
    assert not exp.history_truncated


def test_without_events_durations_are_unknown_not_invented() -> None:
    story = Story().grant("a", -100).fail(-70)
    exp = why(task(status=story.status), [worker("a", "llm")], events=[])
    assert exp.timeline[0].duration(NOW) is None


def test_a_truncated_history_is_flagged() -> None:
    story = Story()
    for i in range(22):
        story.grant("a", -1000 + 10 * i).fail(-995 + 10 * i, max_reclaims=100)
    exp = why(task(status=story.status), [worker("a", "llm")])
    assert len(exp.timeline) == 20
    assert exp.timeline[0].attempt == 3
    assert exp.history_truncated


def test_events_are_sorted_and_the_whole_explanation_is_json() -> None:
    story = Story().grant("a", -10).start(-9).succeed(-5)
    exp = why(task(status=story.status), [worker("a", "llm")], list(reversed(story.events)))
    assert [e.reason for e in exp.events] == ["Assigned", "Running", "Succeeded"]
    data = json.loads(json.dumps(exp.to_dict()))
    assert data["findings"][0]["code"] == "Succeeded"
    assert data["timeline"][0]["durationSeconds"] == 5.0
    assert data["events"][0]["time"] == "2026-01-01T11:59:50Z"


def test_events_of_the_same_second_keep_the_order_the_api_server_stored_them() -> None:
    first = event("Reclaimed", "attempt 1 failed", -5)
    second = event("Assigned", "attempt 2 assigned", -5)
    first["metadata"]["resourceVersion"] = "998"
    second["metadata"]["resourceVersion"] = "1002"
    exp = why(task(status={"phase": "Pending"}), [], [second, first])
    assert [e.reason for e in exp.events] == ["Reclaimed", "Assigned"]


def test_a_worker_that_does_not_parse_is_left_out() -> None:
    broken = worker("broken", "llm")
    broken["spec"]["weight"] = "heavy"
    assert [w.name for w in parse_workers([broken, worker("ok", "llm")])] == ["ok"]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0.0s"), (3.25, "3.2s"), (42, "42s"), (75, "1m15s"), (7322, "2h02m"), (90000, "1d01h")],
)
def test_human_seconds(seconds: float, text: str) -> None:
    assert human_seconds(seconds) == text


@pytest.mark.parametrize(
    "text",
    [
        "could not open [/data/out.json]",
        "[link=https://evil.example]click[/link]",
        "[/]",
        "colour \x1b[31mred\x1b[0m and a bell \x07",
    ],
)
def test_agent_written_text_is_printed_as_text(text: str) -> None:
    """A reason written by an agent is neither rich markup (a MarkupError ended explain
    in a traceback) nor terminal escapes reaching the operator's terminal."""
    import io

    from rich.console import Console

    from agentq.ops import render

    story = Story().grant("w", -10).start(-9).fail_terminal(-5)
    status = story.status
    status["error"] = {"reason": text, "message": text, "retryable": False}
    status["history"][-1]["reason"] = text
    exp = why(
        task(status=status),
        [worker("w", "llm")],
        [event("Failed", text, -5, kind="Warning")],
    )
    out = io.StringIO()
    Console(file=out, width=200, no_color=True).print(render.explanation(exp))
    printed = out.getvalue()
    assert "\x1b" not in printed and "\x07" not in printed
    visible = render.safe(text)
    assert visible in printed.replace("\n", "") or visible[:40] in printed


def test_a_claim_across_namespaces_judges_the_holder_of_the_pool() -> None:
    story = Story().grant("w", -4)
    story.status["workerNamespace"] = "pool"
    paused = [worker("w", "llm", phase="NotReady", paused=True)]
    exp = why(task(status=story.status), paused)  # the pool's workers
    assert "agentq uncordon w -n pool" in finding(exp, "WorkerNotReady")
    # The pool's workers could not be read: nothing said of the holder, nothing invented.
    exp = why(task(status=story.status), [], holders_known=False)
    assert exp.codes == ["AwaitingStart"]


def test_the_lease_of_a_claim_across_namespaces_is_read_in_the_pool() -> None:
    from agentq.ops.kube import Cluster

    asked: list[tuple[str, tuple[int, ...]]] = []

    class Recording(Cluster):
        def _answer(self, method: str, path: str, *args: object, **kw: object) -> object:  # type: ignore[override]
            asked.append((path, kw.get("tolerate", ())))  # type: ignore[arg-type]
            return 403, None

    ops = Recording.__new__(Recording)
    ops.namespace = "team-a"
    body = {"metadata": {"name": "t", "namespace": "team-a"}, "status": {"workerNamespace": "pool"}}
    assert ops.task_lease(body) is None
    assert ops.workers_if_readable("pool") is None
    name = protocol.cross_task_lease_name("team-a", "t")
    assert asked[0] == (f"/apis/coordination.k8s.io/v1/namespaces/pool/leases/{name}", (403, 404))
    assert asked[1][0].endswith("/namespaces/pool/agentworkers")
