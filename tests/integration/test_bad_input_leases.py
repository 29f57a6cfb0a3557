"""Bad-input corpus: forged and malformed Lease traffic, on the real API server.

The test plays the holder of a claim (a *puppet* worker, see tests/corpus.py) or a
stranger with RBAC on Leases or on the task status subresource, and writes what a
buggy or hostile party could: reports with mistyped or forged tokens, malformed
JSON, over-long fields, edited durations and tokens, deleted Leases, forged
status, a task deleted and re-created while a zombie still writes.

Each case asserts a clear refusal or a visible state (event, status, metric), that
nothing else changed, and that the claim still has a terminal path; after each
case the shared operator must still run and dispatch a canary task.

The contract (coord/CONTRACT.md "Wire protocol decisions") decides what is right;
a case that depends on work not yet merged is a strict xfail naming it (none today).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from agentq import protocol
from agentq.operator.readiness import DIAGNOSE_SECONDS
from builders import task
from corpus import Arena, Case, Puppet, cases_as_params, deep_text, running
from fleet import ControlPlane

# The corpus is slow (make test, not make test-fast).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

LEASE = 3  # seconds: every claim here is short, so expiry-driven cases stay quick
BOUND = LEASE + 0.5 + 6  # lease + reconcile interval + margin for a loaded 2-core machine


@pytest.fixture(scope="module")
def arena(
    control_plane: ControlPlane, agentq_crds: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Arena]:
    workdir: Path = tmp_path_factory.mktemp("bad-leases")
    # A 4 s election Lease keeps the election cases quick. Its default renew deadline
    # (2/3 of it, 2.7 s) with renewals every 2 s leaves a renewal 0.7 s of slack: on a
    # starved machine the corpus operator stepped down and came back mid-case. 3.5 s
    # (still below the lease, so a stale leader stops before a standby may take over)
    # gives it 1.5 s.
    arena = Arena(
        control_plane,
        workdir,
        operator_flags=("--leader-lease-seconds", "4"),
        operator_env={"AGENTQ_LEADER_RENEW_SECONDS": "3.5"},
    )
    try:
        yield arena
    finally:
        arena.close()


# --- helpers ------------------------------------------------------------------------


REFUSALS = ("Refused", "Unprocessable", "Invalid")  # StaleReportRefused, InvalidReport, ...


def refusal_events(arena: Arena, name: str) -> list[str]:
    return [r for r in arena.reasons(name) if any(word in r for word in REFUSALS)]


def assert_refused_then_finishes(arena: Arena, p: Puppet, name: str, token: int) -> None:
    """The bad report is refused visibly, changes nothing, and the holder can still finish."""
    arena.wait(f"a refusal event on {name}", lambda: bool(refusal_events(arena, name)), timeout=15)
    status = arena.status(name)
    assert status["phase"] == "Running", status
    assert status["fencingToken"] == token and status["worker"] == p.name
    assert "result" not in status and status.get("reclaims", 0) == 0, status
    p.report(name, token, result={"ok": True})
    done = arena.fleet.wait_phase(name, "Succeeded", timeout=20)["status"]
    assert done["result"] == {"ok": True} and done["fencingToken"] == token


def refused_report(body: Any, *, raw: bool = False) -> Any:
    """A case: the rightful holder (it keeps renewing) writes ``body`` as its report.

    ``body`` may be a callable of the current token; ``raw`` sends it as text.
    """

    def run(arena: Arena) -> None:
        p, name, token = running(arena, "rep")
        value = body(token) if callable(body) else body
        text = value if raw else json.dumps(value)
        with p.renewing(name, token):
            p.raw_report(name, text)
            assert_refused_then_finishes(arena, p, name, token)

    return run


def assert_rejected_then_finishes(arena: Arena, p: Puppet, name: str, token: int) -> None:
    """A malformed report that names the current token and worker (the rightful holder's,
    as far as anyone can tell): never committed, and either refused (the attempt goes
    on) or, as the contract has it, the attempt fails with a visible reason and the
    task gets another one. Either way the task still reaches Succeeded."""

    def visible() -> bool:
        ended = [
            h
            for h in arena.status(name).get("history") or []
            if h.get("token") == token and h.get("outcome") == "Failed" and h.get("reason")
        ]
        return bool(ended) or bool(refusal_events(arena, name))

    arena.wait(f"{name}: the report refused or the attempt failed visibly", visible, timeout=15)
    status = arena.status(name)
    assert status.get("phase") != "Succeeded" and "result" not in status, status
    if status.get("phase") == "Running" and status.get("fencingToken") == token:
        p.report(name, token, result={"ok": True})
        arena.fleet.wait_phase(name, "Succeeded", timeout=20)
    else:
        p.finish(name, timeout=BOUND + 20)


def rejected_report(body: Any, *, raw: bool = False) -> Any:
    """A case: the rightful holder (it keeps renewing) writes a malformed ``body``."""

    def run(arena: Arena) -> None:
        p, name, token = running(arena, "bad-rep")
        value = body(token) if callable(body) else body
        text = value if raw else json.dumps(value)
        with p.renewing(name, token):
            p.raw_report(name, text)
            assert_rejected_then_finishes(arena, p, name, token)

    return run


def report_of(**fields: Any) -> Any:
    """A report body with the rightful worker and outcome; ``fields`` override."""

    def body(token: int) -> dict[str, Any]:
        base: dict[str, Any] = {"token": token, "worker": "pa", "outcome": "Succeeded"}
        base.update({k: (v(token) if callable(v) else v) for k, v in fields.items()})
        return {k: v for k, v in base.items() if v is not _DROP}

    return body


_DROP = object()


def not_wedged(arena: Arena, p: Puppet, name: str, old_token: int, mark: int) -> None:
    """Whatever happened to the claim, the task gets a terminal path: the puppet can
    finish the current grant, and the operator did not log an error every pass."""
    status = p.finish(name, timeout=BOUND + 20)
    assert status["fencingToken"] >= old_token
    errors = arena.errors_since(mark)
    assert len(errors) <= 3, "an error every pass:\n" + "\n".join(errors[:5])


# --- reports: tokens ----------------------------------------------------------------

REPORT_CASES = [
    Case(
        "report-token-true",
        refused_report(report_of(token=True)),
    ),
    Case(
        "report-token-string",
        refused_report(report_of(token=str)),
    ),
    Case(
        "report-token-float",
        refused_report(report_of(token=lambda t: t + 0.9)),
    ),
    Case("report-token-zero", refused_report(report_of(token=0))),
    Case("report-token-negative", refused_report(report_of(token=-1))),
    Case("report-token-beyond-int64", refused_report(report_of(token=2**70))),
    Case("report-token-null", refused_report(report_of(token=None))),
    Case("report-token-missing", refused_report(report_of(token=_DROP))),
    Case("report-token-raised", refused_report(report_of(token=lambda t: t + 1))),
    Case("report-token-object", refused_report(report_of(token={"value": 1}))),
    # --- reports: who and what
    Case("report-worker-other", refused_report(report_of(worker="pb"))),
    Case("report-worker-empty", refused_report(report_of(worker=""))),
    Case("report-worker-number", refused_report(report_of(worker=123))),
    Case("report-outcome-unknown", rejected_report(report_of(outcome="Maybe"))),
    Case("report-outcome-lowercase", rejected_report(report_of(outcome="succeeded"))),
    Case("report-outcome-missing", rejected_report(report_of(outcome=_DROP))),
    # --- reports: not JSON objects
    Case("report-not-json", refused_report('{"token": 1,', raw=True)),
    Case("report-json-array", refused_report("[]", raw=True)),
    Case("report-json-null", refused_report("null", raw=True)),
    Case("report-json-string", refused_report('"done"', raw=True)),
    Case(
        "report-json-nan-token",
        refused_report('{"token": NaN, "worker": "pa", "outcome": "Succeeded"}', raw=True),
    ),
    Case(
        "report-token-1e400",
        refused_report(
            lambda t: '{"token": 1e400, "worker": "pa", "outcome": "Succeeded"}', raw=True
        ),
    ),
    Case(
        "report-result-3000-deep",
        rejected_report(
            lambda t: (
                f'{{"token": {t}, "worker": "pa", "outcome": "Succeeded", '
                f'"result": {deep_text(3000)}}}'
            ),
            raw=True,
        ),
    ),
    Case(
        "report-error-not-an-object",
        rejected_report(report_of(outcome="Failed", error="boom")),
    ),
    Case(
        "report-retryable-not-a-bool",
        rejected_report(
            report_of(outcome="Failed", error={"reason": "X", "message": "", "retryable": "yes"})
        ),
    ),
    Case(
        "report-over-64KiB",
        rejected_report(report_of(result="x" * (70 * 1024))),
    ),
]


# --- over-long fields from the rightful holder: truncated or refused, never a wedge --


# The holder keeps renewing a long lease while it waits: the verdict must come from the
# report itself, at once, not from the lease running out (issue 19, item 9).
LONG_LEASE = 30
AT_ONCE = 10


def long_error_field(field: str, length: int) -> Any:
    def run(arena: Arena) -> None:
        p, name, token = running(arena, f"long-{field}", lease=LONG_LEASE)
        mark = arena.log_mark()
        error = {"reason": "Boom", "message": "", "retryable": True, field: "x" * length}
        with p.renewing(name, token):
            p.report(name, token, outcome="Failed", error=error)
            # A retryable failure: the attempt ends (Pending again, then a new grant).
            arena.wait(
                f"{name} leaves Running on its report",
                lambda: arena.status(name).get("reclaims", 0) >= 1,
                timeout=AT_ONCE,
            )
        status = arena.status(name)
        assert status["history"][-1]["reason"] != "LeaseExpired", status["history"]
        stored = (status.get("error") or {}).get(field) or ""
        limit = {"reason": protocol_limit("MAX_REASON_CHARS", 1024)}.get(
            field, protocol_limit("MAX_MESSAGE_CHARS", 32768)
        )
        assert 0 < len(stored) <= limit, len(stored)
        not_wedged(arena, p, name, token, mark)

    return run


def protocol_limit(name: str, default: int) -> int:
    return int(getattr(protocol, name, default))


def long_result_ref(arena: Arena) -> None:
    p, name, token = running(arena, "long-ref", lease=LONG_LEASE)
    mark = arena.log_mark()
    with p.renewing(name, token):
        p.report(name, token, resultRef="s3://bucket/" + "k" * 5000)
        # The reference cannot be stored (status accepts 4096 characters) and a reference
        # cut short points nowhere: the attempt fails visibly (InvalidReport) at once.
        arena.wait(
            f"{name} leaves Running on its report",
            lambda: arena.status(name).get("phase") != "Running",
            timeout=AT_ONCE,
        )
    status = arena.status(name)
    assert status.get("phase") != "Succeeded" and "resultRef" not in status, status
    assert status["history"][-1]["reason"] == "InvalidReport", status["history"]
    assert "Reclaimed" in arena.reasons(name), arena.reasons(name)
    not_wedged(arena, p, name, token, mark)


def long_progress(arena: Arena) -> None:
    p, name, token = running(arena, "long-progress", lease=LONG_LEASE)
    mark = arena.log_mark()
    p.annotate(name, protocol.ANNOTATION_PROGRESS, "p" * 2000)
    with p.renewing(name, token, progress=False):  # the long marker stays on the Lease
        arena.wait(
            "the marker copied into status, cut to what status accepts",
            lambda: (arena.status(name).get("progress") or "").startswith("ppp"),
            timeout=AT_ONCE + 10,  # copied at most every 10 s
        )
        status = arena.status(name)
        assert status["phase"] == "Running" and len(status["progress"]) <= 1024
        p.report(name, token, result={"ok": True})
        arena.fleet.wait_phase(name, "Succeeded", timeout=AT_ONCE)
    assert len(arena.errors_since(mark)) <= 3


def long_report_with_progress(arena: Arena) -> None:
    """A Succeeded report and a 5,000-character progress marker written together."""
    p, name, token = running(arena, "long-both", lease=LONG_LEASE)
    with p.renewing(name, token, progress=False):
        p.patch_lease(
            name,
            {
                "metadata": {
                    "annotations": {
                        protocol.ANNOTATION_PROGRESS: "p" * 5000,
                        protocol.ANNOTATION_REPORT: json.dumps(
                            {"token": token, "worker": "pa", "outcome": "Succeeded", "result": 1}
                        ),
                    }
                }
            },
        )
        arena.fleet.wait_phase(name, "Succeeded", timeout=AT_ONCE)


def annotations_over_the_api_limit(arena: Arena) -> None:
    p, name, token = running(arena, "huge-annotation")
    before = p.lease(name).metadata.resource_version
    with pytest.raises(ApiException) as refused:
        p.annotate(name, protocol.ANNOTATION_REPORT, "x" * (300 * 1024))
    assert refused.value.status == 422 and "Too long" in refused.value.body
    assert p.lease(name).metadata.resource_version == before  # nothing was written
    p.report(name, token)
    arena.fleet.wait_phase(name, "Succeeded", timeout=20)


FIELD_CASES = [
    Case(
        "report-reason-2000-chars",
        long_error_field("reason", 2000),
    ),
    Case(
        "report-message-40000-chars",
        long_error_field("message", 40000),
    ),
    Case(
        "report-resultref-5000-chars",
        long_result_ref,
    ),
    Case(
        "progress-2000-chars",
        long_progress,
    ),
    Case("report-with-progress-5000-chars", long_report_with_progress),
    Case("annotations-over-256KiB", annotations_over_the_api_limit),
]


# --- the Lease itself edited ----------------------------------------------------------


def foreign_holder(arena: Arena) -> None:
    p, name, token = running(arena, "foreign")
    mark = arena.log_mark()
    p.patch_lease(name, {"spec": {"holderIdentity": "mallory"}})
    forged = {"token": token, "worker": "mallory", "outcome": "Succeeded", "result": "stolen"}
    p.raw_report(name, json.dumps(forged))
    time.sleep(2)
    assert arena.status(name).get("result") != "stolen"
    status = p.finish(name, timeout=BOUND + 20)
    assert status["result"]["by"] == "pa" and status["worker"] == "pa"
    assert len(arena.errors_since(mark)) <= 3


def token_annotation(value: str | None) -> Any:
    def run(arena: Arena) -> None:
        p, name, token = running(arena, "token-annotation")
        mark = arena.log_mark()
        raw = value.replace("{t}", str(token)) if value is not None else None
        p.annotate(name, protocol.ANNOTATION_TOKEN, raw)
        # The holder's own check now fails (the Lease's token is not its token): it stops,
        # as a sidecar would. The operator must still give the task a terminal path.
        not_wedged(arena, p, name, token, mark)

    return run


def lease_duration_raised_by_holder(arena: Arena) -> None:
    p, name, _token = running(arena, "duration-raised")
    p.patch_lease(name, {"spec": {"leaseDurationSeconds": 86400}})
    stopped = time.monotonic()  # the holder never renews again
    arena.wait(
        f"{name} reclaimed after the task's own {LEASE}s lease",
        lambda: arena.status(name).get("reclaims", 0) >= 1,
        timeout=BOUND,
    )
    assert time.monotonic() - stopped <= BOUND
    assert (arena.status(name).get("history") or [{}])[-1].get("reason") == "LeaseExpired"
    p.finish(name)


def lease_duration_lowered_by_stranger(arena: Arena) -> None:
    p, name, token = running(arena, "duration-lowered")
    p.patch_lease(name, {"spec": {"leaseDurationSeconds": 1}})
    # The holder renews every 1.5 s: within the task's 3 s lease, not within 1 s.
    with p.renewing(name, token, every=1.5):
        arena.stays(
            f"{name} keeps its claim (expiry is judged from the task's spec)",
            lambda: arena.status(name).get("reclaims", 0) == 0,
            seconds=3 * LEASE,
        )
    p.report(name, token)
    arena.fleet.wait_phase(name, "Succeeded", timeout=20)


def task_lease_deleted_by_stranger(arena: Arena) -> None:
    p, name, token = running(arena, "lease-deleted")
    mark = arena.log_mark()
    arena.leases.delete_namespaced_lease(protocol.task_lease_name(name), arena.namespace)
    not_wedged(arena, p, name, token, mark)


def holder_released_the_lease(arena: Arena) -> None:
    p, name, token = running(arena, "released")
    mark = arena.log_mark()
    p.patch_lease(name, {"spec": {"holderIdentity": None}})
    not_wedged(arena, p, name, token, mark)


def renew_time_in_the_future(arena: Arena) -> None:
    p, name, _token = running(arena, "renew-future")
    p.patch_lease(name, {"spec": {"renewTime": "2099-01-01T00:00:00.000000Z"}})
    # The holder stops; its renewTime claims decades: the operator's own clock decides.
    arena.wait(
        f"{name} reclaimed",
        lambda: arena.status(name).get("reclaims", 0) >= 1,
        timeout=BOUND,
    )
    p.finish(name)


def task_lease_label_retargeted(arena: Arena) -> None:
    """The Lease is its task's by its name, whatever its agentq.dev/task label says: the
    holder's report is committed at once, not when its 30 s lease runs out."""
    p, name, token = running(arena, "relabelled", lease=LONG_LEASE)
    p.patch_lease(name, {"metadata": {"labels": {protocol.LABEL_TASK: "somebody-else"}}})
    with p.renewing(name, token):
        time.sleep(1)
        assert arena.status(name)["phase"] == "Running"
        p.report(name, token)
        arena.fleet.wait_phase(name, "Succeeded", timeout=AT_ONCE)


def task_lease_label_removed(arena: Arena) -> None:
    """Anyone with Lease rights takes agentq.dev/lease off a claim's Lease: the watch no
    longer shows it. The operator puts the label back (issue 19, item 9), so the holder's
    report is committed at once, well before its 30 s lease would run out."""
    p, name, token = running(arena, "unlabelled", lease=LONG_LEASE)
    with p.renewing(name, token):
        p.patch_lease(name, {"metadata": {"labels": {protocol.LABEL_LEASE_KIND: None}}})
        arena.wait(
            "the label back on the Lease",
            lambda: (p.lease(name).metadata.labels or {}).get(protocol.LABEL_LEASE_KIND) == "task",
            timeout=AT_ONCE,
        )
        p.report(name, token, result={"ok": True})
        arena.fleet.wait_phase(name, "Succeeded", timeout=AT_ONCE)


def report_on_the_worker_lease(arena: Arena) -> None:
    p = arena.puppets["pa"]
    lease_name = protocol.worker_lease_name("pa")
    forged = {"token": 1, "worker": "pa", "outcome": "Succeeded"}
    arena.leases.patch_namespaced_lease(
        lease_name,
        arena.namespace,
        {"metadata": {"annotations": {protocol.ANNOTATION_REPORT: json.dumps(forged)}}},
    )
    name = p.submit("after-worker-report", lease=LEASE)
    token = p.wait_grant(name)
    assert arena.status(name)["phase"] in ("Assigned", "Running")
    p.report(name, token)
    arena.fleet.wait_phase(name, "Succeeded", timeout=20)


def ghost_lease(arena: Arena) -> None:
    name = arena.name("ghost")
    body = client.V1Lease(
        metadata=client.V1ObjectMeta(
            name=protocol.task_lease_name(name),
            labels={protocol.LABEL_LEASE_KIND: "task", protocol.LABEL_TASK: name},
            annotations={protocol.ANNOTATION_TOKEN: "7"},
        ),
        spec=client.V1LeaseSpec(holder_identity="pa", lease_duration_seconds=3),
    )
    arena.leases.create_namespaced_lease(arena.namespace, body)
    time.sleep(2)  # a pass or four over a Lease whose task does not exist


def pre_planted_lease(arena: Arena) -> None:
    p = arena.puppets["pa"]
    name = arena.name("planted")
    planted = {"token": 1, "worker": "pa", "outcome": "Succeeded", "result": "planted"}
    body = client.V1Lease(
        metadata=client.V1ObjectMeta(
            name=protocol.task_lease_name(name),
            labels={protocol.LABEL_LEASE_KIND: "task", protocol.LABEL_TASK: name},
            annotations={
                protocol.ANNOTATION_TOKEN: "1",
                protocol.ANNOTATION_REPORT: json.dumps(planted),
            },
        ),
        spec=client.V1LeaseSpec(holder_identity="pa", lease_duration_seconds=3),
    )
    arena.leases.create_namespaced_lease(arena.namespace, body)
    arena.create_task(task(name).requires("pa").lease(LEASE))
    token = p.wait_grant(name)
    status = arena.status(name)
    assert status.get("result") != "planted" and status["phase"] in ("Assigned", "Running")
    p.report(name, token, result={"by": "pa"})
    done = arena.fleet.wait_phase(name, "Succeeded", timeout=20)["status"]
    assert done["result"] == {"by": "pa"}


def progress_flood(arena: Arena) -> None:
    p, name, token = running(arena, "progress-flood")
    for i in range(150):
        p.renew(name, token, progress=f"step {i}")
    p.report(name, token)
    arena.fleet.wait_phase(name, "Succeeded", timeout=20)
    reasons = arena.fleet.wait_reasons(name, {"Succeeded": 1})
    assert len(reasons) <= 5, reasons  # one event per transition, none per renewal


def stale_report_metric(arena: Arena) -> None:
    before = arena.metric("agentq_stale_reports_refused_total")
    p, name, token = running(arena, "metric")
    with p.renewing(name, token):
        p.report(name, token + 5)
        arena.wait(
            "agentq_stale_reports_refused_total counts the refusal",
            lambda: arena.metric("agentq_stale_reports_refused_total") > before,
            timeout=15,
        )
    p.report(name, token)
    arena.fleet.wait_phase(name, "Succeeded", timeout=20)


def refused_reports_in_status(arena: Arena) -> None:
    p, name, token = running(arena, "refused-count")
    with p.renewing(name, token):
        p.report(name, token + 5)
        arena.wait(
            "status.refusedReports counts the refusal",
            lambda: arena.status(name).get("refusedReports", 0) >= 1,
            timeout=15,
        )
    p.report(name, token)
    arena.fleet.wait_phase(name, "Succeeded", timeout=20)


# The API server's limit on a object's annotations, keys and values summed.
ANNOTATIONS_LIMIT = 256 * 1024


def annotations_full_then_cancelled(arena: Arena) -> None:
    """The holder fills its Lease's annotations to the API server's limit, so that the
    operator's revoke mark no longer fits (422), and keeps renewing; then the task is
    cancelled. It still ends Cancelled within the bound, its Lease deleted (the holder
    loses it), with a warning saying why -- not Running for as long as the holder
    renews."""
    p, name, token = running(arena, "full-annotations")
    used = sum(len(k) + len(v) for k, v in (p.lease(name).metadata.annotations or {}).items())
    key = "example.com/filler"
    # Room for 10 more bytes: less than the mark (agentq.dev/revoked: Cancelled) needs.
    p.annotate(name, key, "x" * (ANNOTATIONS_LIMIT - used - len(key) - 10))
    with p.renewing(name, token, progress=False):
        arena.fleet.kubectl(
            "patch", "agenttask", name, "--type=merge", "-p", '{"spec":{"cancel":true}}'
        )
        cancelled = time.monotonic()
        done = arena.fleet.wait_phase(name, "Cancelled", timeout=BOUND)["status"]
    assert time.monotonic() - cancelled <= BOUND
    assert done["history"][-1]["outcome"] == "Cancelled", done
    assert done["history"][-1]["token"] == token, done
    assert "RevokeRefused" in arena.reasons(name)
    arena.wait(f"the Lease of {name} deleted", lambda: arena.fleet.task_lease(name) is None)


LEASE_CASES = [
    Case("annotations-full-then-cancelled", annotations_full_then_cancelled),
    Case("foreign-holder-report", foreign_holder),
    Case(
        "token-annotation-raised",
        token_annotation("{t}00"),
    ),
    Case("token-annotation-zero", token_annotation("0")),
    Case("token-annotation-garbage", token_annotation("abc")),
    Case("token-annotation-padded", token_annotation(" {t}")),
    Case("token-annotation-removed", token_annotation(None)),
    Case(
        "lease-duration-raised-by-holder",
        lease_duration_raised_by_holder,
    ),
    Case(
        "lease-duration-lowered-by-stranger",
        lease_duration_lowered_by_stranger,
    ),
    Case("task-lease-deleted-by-stranger", task_lease_deleted_by_stranger),
    Case("holder-identity-cleared", holder_released_the_lease),
    Case("renew-time-in-2099", renew_time_in_the_future),
    Case("task-label-retargeted", task_lease_label_retargeted),
    Case("task-lease-label-removed", task_lease_label_removed),
    Case("report-on-the-worker-lease", report_on_the_worker_lease),
    Case("lease-without-a-task", ghost_lease),
    Case("lease-planted-before-the-task", pre_planted_lease),
    Case("progress-flood", progress_flood),
    Case("stale-report-metric", stale_report_metric),
    Case(
        "refused-reports-in-status",
        refused_reports_in_status,
    ),
]


# --- worker and election Leases -------------------------------------------------------


def worker_lease_deleted(arena: Arena) -> None:
    p = arena.puppets["pb"]
    p.worker_lease_paused = True
    try:
        arena.leases.delete_namespaced_lease(protocol.worker_lease_name("pb"), arena.namespace)
        arena.wait(
            "pb NotReady",
            lambda: (arena.fleet.worker("pb").get("status") or {}).get("phase") == "NotReady",
            timeout=15,
        )
        ready = next(
            c for c in arena.fleet.worker("pb")["status"]["conditions"] if c["type"] == "Ready"
        )
        assert ready["status"] == "False"
        name = p.submit("while-not-ready", lease=LEASE)
        arena.stays(
            f"{name} is not given to a worker without a Lease",
            lambda: arena.status(name).get("worker") is None,
            seconds=2,
        )
    finally:
        p.worker_lease_paused = False
    p.finish(name, timeout=30)


def worker_lease_without_its_label(arena: Arena) -> None:
    p = arena.puppets["pb"]
    p.worker_lease_paused = True
    try:
        lease = arena.leases.read_namespaced_lease(
            protocol.worker_lease_name("pb"), arena.namespace
        )
        lease.metadata.labels = {protocol.LABEL_WORKER: "pb"}  # agentq.dev/lease dropped
        lease.spec.renew_time = None
        arena.leases.replace_namespaced_lease(lease.metadata.name, arena.namespace, lease)

        def says_which() -> bool:
            status = arena.fleet.worker("pb").get("status") or {}
            ready = next((c for c in status.get("conditions") or [] if c["type"] == "Ready"), {})
            message = ready.get("message", "")
            return (
                status.get("phase") == "NotReady"
                and protocol.worker_lease_name("pb") in message
                and protocol.LABEL_LEASE_KIND in message
            )

        # The watch selects worker Leases by that label, so the operator finds the Lease
        # by reading it, at most every DIAGNOSE_SECONDS per worker (the case before this
        # one may just have read it): until then the condition says the Lease is missing.
        arena.wait(
            "the Ready condition names the Lease and the missing label",
            says_which,
            timeout=DIAGNOSE_SECONDS + 15,
        )
    finally:
        arena.leases.delete_namespaced_lease(protocol.worker_lease_name("pb"), arena.namespace)
        p.worker_lease_paused = False


def election_lease(arena: Arena) -> client.V1Lease | None:
    try:
        lease: client.V1Lease = arena.leases.read_namespaced_lease(
            "agentq-operator", arena.namespace
        )
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return lease


def election_lease_deleted(arena: Arena) -> None:
    arena.leases.delete_namespaced_lease("agentq-operator", arena.namespace)
    # The leader finds it gone at its next round and creates it again (4 s lease, 2 s retry).
    arena.wait(
        "the election Lease back, held by the operator",
        lambda: bool((lease := election_lease(arena)) and lease.spec.holder_identity),
        timeout=20,
    )


def election_lease_forged(arena: Arena) -> None:
    arena.wait("an election Lease to forge", lambda: election_lease(arena) is not None, timeout=20)
    arena.leases.patch_namespaced_lease(
        "agentq-operator", arena.namespace, {"spec": {"holderIdentity": "mallory"}}
    )
    # mallory never renews: the operator takes the election Lease back after its
    # 4 s lease (plus a 2 s retry); the canary of Arena.check proves dispatch resumed.


ELECTION_CASES = [
    Case("worker-lease-deleted", worker_lease_deleted),
    Case(
        "worker-lease-label-removed",
        worker_lease_without_its_label,
    ),
    Case("election-lease-deleted", election_lease_deleted),
    Case("election-lease-forged-holder", election_lease_forged),
]


# --- forged task status, and a name reused ----------------------------------------


def status_token_zero(arena: Arena) -> None:
    p, name, token = running(arena, "status-token-zero")
    mark = arena.log_mark()
    arena.patch_status(name, {"fencingToken": 0})
    status = p.finish(name, timeout=BOUND + 20)
    # A token is never reused: whatever the operator does, the grant that finished
    # carries a token above the one the forged status tried to roll back.
    assert status["fencingToken"] >= token
    assert len(arena.errors_since(mark)) <= 3


def status_forged_succeeded(arena: Arena) -> None:
    p, name, token = running(arena, "status-succeeded")
    mark = arena.log_mark()
    arena.patch_status(name, {"phase": "Succeeded"})
    # The attempt is over as far as the status says: its Lease goes, so the holder's
    # next write finds nothing (and stops); nothing is re-dispatched.
    arena.wait(
        f"{name}'s Lease removed", lambda: arena.fleet.task_lease(name) is None, timeout=BOUND
    )
    with pytest.raises(Exception):  # noqa: B017 - LeaseLost (404) is what the holder sees
        p.renew(name, token)
    assert arena.status(name)["phase"] == "Succeeded"
    assert len(arena.errors_since(mark)) <= 3


def status_wiped(arena: Arena) -> None:
    p, name, token = running(arena, "status-wiped")
    zombie = json.dumps(
        {"token": token, "worker": "pa", "outcome": "Succeeded", "result": "zombie"}
    )
    arena.patch_status(
        name,
        {
            k: None
            for k in ("phase", "worker", "attempt", "fencingToken", "leaseName", "assignedAt")
        },
    )
    new = p.wait_grant(name, timeout=BOUND + 20)
    assert new > token, f"token {new} reused after the status was wiped (was {token})"
    p.raw_report(name, zombie)
    arena.fleet.wait_reasons(name, {"StaleReportRefused": 1})  # seen, and refused
    assert arena.status(name).get("result") != "zombie"
    p.report(name, new, result={"by": "pa"})
    arena.fleet.wait_phase(name, "Succeeded", timeout=20)


def recreated_while_a_zombie_writes(arena: Arena) -> None:
    p, name, token = running(arena, "recreated")
    arena.delete_task(name)
    arena.wait(f"{name} gone", lambda: _gone(arena, name), timeout=30)
    arena.create_task(task(name).requires("pa").lease(LEASE))
    new = p.wait_grant(name, timeout=30)
    assert new > token, f"token {new} reused across delete and re-create (was {token})"
    zombie = {"token": token, "worker": "pa", "outcome": "Succeeded", "result": "zombie"}
    p.raw_report(name, json.dumps(zombie))
    arena.fleet.wait_reasons(name, {"StaleReportRefused": 1})  # seen, and refused
    assert arena.status(name).get("result") != "zombie"
    p.report(name, new, result={"by": "pa"})
    assert arena.fleet.wait_phase(name, "Succeeded", timeout=20)["status"]["result"] == {"by": "pa"}


def _gone(arena: Arena, name: str) -> bool:
    try:
        arena.task(name)
    except ApiException as err:
        return err.status == 404
    return False


STATUS_CASES = [
    Case(
        "status-fencing-token-set-to-0",
        status_token_zero,
    ),
    Case("status-phase-forged-succeeded", status_forged_succeeded),
    Case(
        "status-wiped-mid-attempt",
        status_wiped,
    ),
    Case(
        "task-recreated-while-zombie-writes",
        recreated_while_a_zombie_writes,
    ),
]

CASES = REPORT_CASES + FIELD_CASES + LEASE_CASES + ELECTION_CASES + STATUS_CASES


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", cases_as_params(CASES))
def test_forged_or_malformed_lease_traffic(arena: Arena, case: Case) -> None:
    with arena.case():
        case.run(arena)
