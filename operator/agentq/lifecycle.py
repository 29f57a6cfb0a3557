"""The AgentTask state machine, as pure functions from a typed status to a status patch.

Every transition the operator makes is decided here and returned as a value: a
JSON merge patch for ``status`` (and the events that record it). The glue
applies it with a resourceVersion precondition, so a decision made on a stale
snapshot is refused by the API server instead of overwriting newer state.

Phases (``agentq.models.TaskPhase``): Pending -> Assigned -> Running ->
Succeeded | Failed | DeadLettered, with Pending again after a failed attempt
(expired lease, retryable failure, progress deadline exceeded) while
``reclaims <= maxReclaims``, and Held for ``onLeaseExpiry: Hold``. Counting:
``reclaims`` is the number of failed attempts so far; the attempt that makes it
exceed ``maxReclaims`` dead-letters the task, so a poison task gets exactly
``maxReclaims + 1`` attempts. A task the operator cannot process at all (see
``unprocessable``) ends Failed with an ``Unprocessable`` condition.

Everything copied from what a holder wrote (reason, message, progress) is cut
to what the CRD schema accepts, so a status write is never refused for size.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

from agentq import protocol
from agentq.clock import rfc3339
from agentq.models import (
    MAX_HISTORY,
    AgentTaskStatus,
    AttemptOutcome,
    ConditionStatus,
    RetryBackoff,
    TaskPhase,
    condition_reason,
)
from agentq.protocol import (
    MAX_MESSAGE_CHARS,
    MAX_PROGRESS_CHARS,
    MAX_REASON_CHARS,
    Report,
    bounded_text,
    requeue_id,
)

HISTORY_LIMIT = MAX_HISTORY
# A condition's message: the CRD accepts 32768 characters; events cut at 1024.
_CONDITION_MESSAGE_CHARS = 4096

# Condition types the operator sets on an AgentTask.
ASSIGNED = "Assigned"
COMPLETE = "Complete"
DEAD_LETTERED = "DeadLettered"
HELD = "Held"
UNSCHEDULABLE = "Unschedulable"
QUEUED = "Queued"  # a task naming an AgentQueue: whether the queue admits it
UNPROCESSABLE = "Unprocessable"
CANCELLED = "Cancelled"
REVOKED = "Revoked"
BUDGETED = "Budgeted"  # a task naming AgentBudgets: whether they admit it (docs/budgets.md)


@dataclass(frozen=True)
class Transition:
    """A decided change: the status merge patch and the events that record it.

    ``reason`` / ``message`` / ``warning`` describe the main event (no event when
    ``reason`` is empty); ``extra_events`` (reason, message, warning) are recorded first.
    """

    patch: dict[str, Any]
    reason: str
    message: str
    warning: bool = False
    extra_events: tuple[tuple[str, str, bool], ...] = field(default_factory=tuple)

    @property
    def phase(self) -> TaskPhase | None:
        phase = self.patch.get("phase")
        return TaskPhase(phase) if phase is not None else None

    def then(self, other: Transition) -> Transition:
        """This transition followed by ``other``, as one patch (``other`` wins a field)."""
        return Transition(
            patch={**self.patch, **other.patch},
            reason=other.reason or self.reason,
            message=other.message if other.reason else self.message,
            warning=other.warning if other.reason else self.warning,
            extra_events=(
                *self.extra_events,
                *(
                    ((self.reason, self.message, self.warning),)
                    if self.reason and other.reason
                    else ()
                ),
                *other.extra_events,
            ),
        )

    def apply(self, status: AgentTaskStatus) -> AgentTaskStatus:
        """``status`` with the patch merged in (what the API server will store)."""
        merged = {**status.to_dict(), **self.patch}
        return AgentTaskStatus.model_validate({k: v for k, v in merged.items() if v is not None})


def merge(transitions: list[Transition]) -> Transition | None:
    """Several transitions decided on one snapshot, as one write."""
    if not transitions:
        return None
    merged = transitions[0]
    for t in transitions[1:]:
        merged = merged.then(t)
    return merged


def _history(status: AgentTaskStatus, entry: dict[str, Any]) -> list[dict[str, Any]]:
    history = [h.to_dict() for h in status.history or []]
    history.append(entry)
    return history[-HISTORY_LIMIT:]


def _condition(kind: str, ok: bool, reason: str, message: str, now: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": (ConditionStatus.TRUE if ok else ConditionStatus.FALSE).value,
        # Agents report free-form reasons; a condition's reason must be a CamelCase word.
        "reason": condition_reason(reason),
        "message": bounded_text(message, _CONDITION_MESSAGE_CHARS),
        "lastTransitionTime": now,
    }


def _conditions(
    status: AgentTaskStatus, *new: dict[str, Any], drop: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    replaced = {c["type"] for c in new} | set(drop)
    kept = [c.to_dict() for c in status.conditions or [] if c.type not in replaced]
    return [*kept, *new]


def condition(status: AgentTaskStatus, kind: str) -> tuple[bool, str] | None:
    """(is it True, its message) for the condition ``kind``, if the status has it."""
    for c in status.conditions or []:
        if c.type == kind:
            return c.status is ConditionStatus.TRUE, c.message
    return None


def _entry(
    status: AgentTaskStatus, *, outcome: AttemptOutcome, reason: str, now: str
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "outcome": outcome.value,
        "reason": bounded_text(reason, MAX_REASON_CHARS),
        "time": now,
    }
    if status.worker is not None:
        entry["worker"] = status.worker
    if status.fencing_token is not None:
        entry["token"] = status.fencing_token
    if status.attempt is not None:
        entry["attempt"] = status.attempt
    return entry


def grant(
    status: AgentTaskStatus,
    *,
    worker: str,
    lease_name: str,
    token: int,
    now: datetime.datetime,
    epoch: int | None = None,
    worker_namespace: str | None = None,
) -> Transition:
    """Assign the task to ``worker`` with ``token``, which must exceed every earlier one.
    ``worker_namespace``: the worker's namespace when it is not the task's (a claim across
    namespaces, docs/tenancy.md); None clears the field.
    ``epoch``: the granting leader's (its election Lease's leaseTransitions), which the
    admission policy compares with the Lease's (None: no leader election; the field is
    cleared)."""
    if token <= (status.fencing_token or 0):
        raise ValueError(f"token {token} is not above the task's {status.fencing_token}")
    attempt = (status.attempt or 0) + 1
    stamp = rfc3339(now)
    return Transition(
        patch={
            "phase": TaskPhase.ASSIGNED.value,
            "worker": worker,
            "workerNamespace": worker_namespace,
            "attempt": attempt,
            "reclaims": status.reclaims or 0,
            "fencingToken": token,
            "leaderEpoch": epoch,
            "leaseName": lease_name,
            "assignedAt": stamp,
            "startTime": rfc3339(status.start_time) if status.start_time else stamp,
            "startedAt": None,
            "notBefore": None,
            "graceUntil": None,
            "progress": None,
            "lastTransitionTime": stamp,
            "conditions": _conditions(
                status,
                _condition(ASSIGNED, True, "Assigned", f"assigned to {worker}", stamp),
                drop=(UNSCHEDULABLE, BUDGETED),
            ),
        },
        reason="Assigned",
        message=f"attempt {attempt} assigned to worker {worker} with fencing token {token}",
    )


def start(status: AgentTaskStatus, *, now: datetime.datetime) -> Transition:
    """The holder renewed its claim for the first time: the attempt runs."""
    stamp = rfc3339(now)
    return Transition(
        patch={"phase": TaskPhase.RUNNING.value, "startedAt": stamp, "lastTransitionTime": stamp},
        reason="Running",
        message=f"worker {status.worker} started attempt {status.attempt}",
    )


def progress(_status: AgentTaskStatus, *, marker: str) -> Transition:
    """Copy the holder's progress marker (cut to what status accepts); no event."""
    return Transition(
        patch={"progress": bounded_text(marker, MAX_PROGRESS_CHARS)}, reason="", message=""
    )


def succeed(status: AgentTaskStatus, report: Report, *, now: datetime.datetime) -> Transition:
    stamp = rfc3339(now)
    return Transition(
        patch={
            "phase": TaskPhase.SUCCEEDED.value,
            "result": report.result,
            "resultRef": report.result_ref,
            "error": None,
            "finishedAt": stamp,
            "lastTransitionTime": stamp,
            "graceUntil": None,
            "history": _history(
                status,
                _entry(status, outcome=AttemptOutcome.SUCCEEDED, reason="Completed", now=stamp),
            ),
            "conditions": _conditions(
                status,
                _condition(COMPLETE, True, "Succeeded", "the agent reported success", stamp),
            ),
        },
        reason="Succeeded",
        message=f"worker {report.worker} completed attempt {status.attempt}",
    )


def _error(reason: str, message: str, retryable: bool) -> dict[str, Any]:
    return {
        "reason": bounded_text(reason, MAX_REASON_CHARS),
        "message": bounded_text(message, MAX_MESSAGE_CHARS),
        "retryable": retryable,
    }


def fail_attempt(
    status: AgentTaskStatus,
    *,
    reason: str,
    message: str,
    max_reclaims: int,
    backoff: RetryBackoff,
    now: datetime.datetime,
    rand: float,
    retryable: bool = True,
) -> Transition:
    """A failed attempt (lease expired, retryable failure, progress deadline exceeded).

    Back to Pending after a backoff while failures stay within ``max_reclaims``;
    otherwise DeadLettered. ``rand`` is a uniform draw from [0, 1) for the jitter.
    """
    stamp = rfc3339(now)
    reclaims = (status.reclaims or 0) + 1
    short_reason = bounded_text(reason, MAX_REASON_CHARS)
    history = _history(
        status, _entry(status, outcome=AttemptOutcome.FAILED, reason=short_reason, now=stamp)
    )
    common: dict[str, Any] = {
        "reclaims": reclaims,
        "worker": None,
        "workerNamespace": None,
        "history": history,
        "lastTransitionTime": stamp,
        "graceUntil": None,
        "error": _error(reason, message, retryable),
    }
    # Event messages are cut at 1024 characters by the glue; keep the reason readable.
    said = bounded_text(f"{short_reason}: {message}", 512)
    if reclaims > max_reclaims:
        return Transition(
            patch={
                **common,
                "phase": TaskPhase.DEAD_LETTERED.value,
                "finishedAt": stamp,
                "notBefore": None,
                "conditions": _conditions(
                    status,
                    _condition(
                        DEAD_LETTERED,
                        True,
                        reason,
                        f"{reclaims} failed attempts exceed maxReclaims={max_reclaims}",
                        stamp,
                    ),
                ),
            },
            reason="DeadLettered",
            message=(
                f"attempt {status.attempt} failed ({said}); "
                f"{reclaims} failed attempts exceed maxReclaims={max_reclaims}"
            ),
            warning=True,
            extra_events=(
                (
                    "Reclaimed",
                    f"attempt {status.attempt} on {status.worker} failed ({said}); not retried",
                    True,
                ),
            ),
        )
    delay = backoff.delay_seconds(reclaims, rand=rand)
    return Transition(
        patch={
            **common,
            "phase": TaskPhase.PENDING.value,
            "notBefore": rfc3339(now + datetime.timedelta(seconds=delay)),
        },
        reason="Reclaimed",
        message=(
            f"attempt {status.attempt} on {status.worker} failed ({said}); "
            f"failure {reclaims} of at most {max_reclaims + 1}, retrying in {delay:.1f}s"
        ),
        warning=True,
    )


def fail_terminal(status: AgentTaskStatus, report: Report, *, now: datetime.datetime) -> Transition:
    """The agent reported a non-retryable failure: the task is Failed, not retried."""
    stamp = rfc3339(now)
    error = report.error
    reason = error.reason if error else "Failed"
    short_reason = bounded_text(reason, MAX_REASON_CHARS)
    return Transition(
        patch={
            "phase": TaskPhase.FAILED.value,
            "error": _error(reason, error.message if error else "", False),
            "finishedAt": stamp,
            "lastTransitionTime": stamp,
            "graceUntil": None,
            "history": _history(
                status,
                _entry(status, outcome=AttemptOutcome.FAILED, reason=short_reason, now=stamp),
            ),
        },
        reason="Failed",
        message=(
            f"worker {report.worker} reported a non-retryable failure: "
            f"{bounded_text(short_reason, 256)}"
        ),
        warning=True,
    )


def hold(status: AgentTaskStatus, *, reason: str, now: datetime.datetime) -> Transition:
    stamp = rfc3339(now)
    return Transition(
        patch={
            "phase": TaskPhase.HELD.value,
            "lastTransitionTime": stamp,
            "history": _history(
                status, _entry(status, outcome=AttemptOutcome.HELD, reason=reason, now=stamp)
            ),
            "conditions": _conditions(
                status, _condition(HELD, True, reason, "waiting for a person to requeue", stamp)
            ),
        },
        reason="Held",
        message=(
            f"lease of attempt {status.attempt} on {status.worker} expired; "
            "held for a person (agentq requeue)"
        ),
        warning=True,
        extra_events=(("LeaseExpired", f"lease held by {status.worker} expired", True),),
    )


def grace(
    status: AgentTaskStatus, *, until: datetime.datetime, now: datetime.datetime
) -> Transition:
    return Transition(
        patch={"graceUntil": rfc3339(until), "lastTransitionTime": rfc3339(now)},
        reason="LeaseExpired",
        message=(
            f"lease held by {status.worker} expired; accepting a late report until {rfc3339(until)}"
        ),
        warning=True,
    )


def end_grace(_status: AgentTaskStatus) -> Transition:
    """The holder renewed within its grace period: the claim goes on."""
    return Transition(patch={"graceUntil": None}, reason="", message="")


def requeue(status: AgentTaskStatus, *, now: datetime.datetime, request: str) -> Transition:
    """A person redrives a Held, DeadLettered or Failed task: back to Pending, fresh budget."""
    stamp = rfc3339(now)
    return Transition(
        patch={
            "phase": TaskPhase.PENDING.value,
            "worker": None,
            "workerNamespace": None,
            "reclaims": 0,
            "notBefore": None,
            "graceUntil": None,
            "finishedAt": None,
            "startTime": None,  # a redrive's deadline counts afresh
            "error": None,
            "lastTransitionTime": stamp,
            "requeueHandled": requeue_id(request),
            "history": _history(
                status,
                _entry(status, outcome=AttemptOutcome.REQUEUED, reason="Requeued", now=stamp),
            ),
            "conditions": _conditions(status, drop=(DEAD_LETTERED, HELD, CANCELLED, REVOKED)),
        },
        reason="Requeued",
        message=f"requeued from {status.phase} (request {requeue_id(request)})",
    )


def _waits(
    status: AgentTaskStatus,
    condition: tuple[str, bool, str],
    *,
    message: str,
    now: datetime.datetime,
    event: str,
) -> Transition:
    """A Pending task's condition saying why it waits (``condition``: its type, status
    and reason); a task not yet given a phase is given Pending with it. ``event``: the
    Warning's reason ('' for none)."""
    kind, value, reason = condition
    patch: dict[str, Any] = {
        "conditions": _conditions(status, _condition(kind, value, reason, message, rfc3339(now)))
    }
    if status.phase is None:
        patch["phase"] = TaskPhase.PENDING.value
    return Transition(patch=patch, reason=event, message=message, warning=True)


def _cleared(
    status: AgentTaskStatus,
    condition: tuple[str, bool, str],
    *,
    message: str,
    now: datetime.datetime,
) -> Transition:
    """The condition that said why a task waited, turned (no event)."""
    kind, value, reason = condition
    stamp = rfc3339(now)
    return Transition(
        patch={"conditions": _conditions(status, _condition(kind, value, reason, message, stamp))},
        reason="",
        message="",
    )


def unschedulable(status: AgentTaskStatus, *, message: str, now: datetime.datetime) -> Transition:
    """No worker in the namespace can take the task (its capabilities are missing)."""
    condition = (UNSCHEDULABLE, True, "MissingCapabilities")
    return _waits(status, condition, message=message, now=now, event="Unschedulable")


def schedulable(status: AgentTaskStatus, *, message: str, now: datetime.datetime) -> Transition:
    """A worker that can take the task exists again."""
    return _cleared(status, (UNSCHEDULABLE, False, "WorkerAvailable"), message=message, now=now)


def not_queued(
    status: AgentTaskStatus, *, reason: str, message: str, now: datetime.datetime
) -> Transition:
    """The AgentQueue the task names does not admit it (``reason`` says why): it waits."""
    return _waits(status, (QUEUED, False, reason), message=message, now=now, event=reason)


def condition_reason_of(status: AgentTaskStatus, kind: str) -> str | None:
    """The reason of the condition ``kind``, if the status has it."""
    for c in status.conditions or []:
        if c.type == kind:
            return c.reason
    return None


def not_budgeted(
    status: AgentTaskStatus,
    *,
    reason: str,
    message: str,
    now: datetime.datetime,
    warning: bool,
) -> Transition:
    """An AgentBudget the task names does not admit it (``reason``: a verdict -- the
    budget is missing, the estimate above a limit -- or a wait for room): it waits."""
    condition = (BUDGETED, False, reason)
    return _waits(status, condition, message=message, now=now, event=reason if warning else "")


def budgeted(status: AgentTaskStatus, *, message: str, now: datetime.datetime) -> Transition:
    """The AgentBudgets the task names may admit it again (after a verdict)."""
    return _cleared(status, (BUDGETED, True, "Admitted"), message=message, now=now)


def queued(status: AgentTaskStatus, *, message: str, now: datetime.datetime) -> Transition:
    """The AgentQueue the task names admits it now."""
    return _cleared(status, (QUEUED, True, "Admitted"), message=message, now=now)


def unprocessable(
    status: AgentTaskStatus, *, reason: str, message: str, now: datetime.datetime
) -> Transition:
    """The operator cannot process this task at all: Failed, saying why, never retried."""
    stamp = rfc3339(now)
    return Transition(
        patch={
            "phase": TaskPhase.FAILED.value,
            "worker": None,
            "workerNamespace": None,
            "error": _error(reason, message, False),
            "finishedAt": stamp,
            "lastTransitionTime": stamp,
            "graceUntil": None,
            "conditions": _conditions(
                status, _condition(UNPROCESSABLE, True, reason, message, stamp)
            ),
        },
        reason="Unprocessable",
        message=bounded_text(f"{reason}: {message}", 1024),
        warning=True,
    )


#: Why a task ends ``Failed`` when etcd refuses its status for the object's size.
OBJECT_TOO_LARGE = "ObjectTooLarge"
#: Short on purpose: every byte of it must fit beside the object.
TOO_LARGE_MESSAGE = "too large for etcd to store with a status; keep large inputs outside the task"


def too_large(status: AgentTaskStatus, *, now: datetime.datetime) -> tuple[Transition, ...]:
    """Ways to end a task whose status etcd refuses for the object's size, each smaller
    than the one before: tried in turn until one is taken (``Committer.refused_for_good``).

    1. ``Failed`` with the ``Unprocessable`` condition and the error, both short;
    2. ``Failed`` with ``error.reason`` ``ObjectTooLarge`` alone;
    3. ``Failed`` alone.

    Each also clears the claim's fields (a merge patch removing them: bytes given back).
    The API server retries a write that is too large without the object's
    managedFields, so what is left to make room on is the user's own metadata and spec:
    an object within 75 bytes of etcd's limit takes no write at all (docs/operator.md,
    "Known limits"), and the caller says so in an Event.
    """
    said = f"{OBJECT_TOO_LARGE}: {TOO_LARGE_MESSAGE}"
    cleared: dict[str, Any] = {
        "phase": TaskPhase.FAILED.value,
        "worker": None,
        "workerNamespace": None,
        "graceUntil": None,
    }
    compact = unprocessable(status, reason=OBJECT_TOO_LARGE, message=TOO_LARGE_MESSAGE, now=now)
    return (
        Transition(
            patch={**compact.patch, **cleared}, reason=compact.reason, message=said, warning=True
        ),
        Transition(
            patch={**cleared, "error": {"reason": OBJECT_TOO_LARGE}},
            reason="Unprocessable",
            message=f"{said} (the status holds only its phase and error reason: nothing more fits)",
            warning=True,
        ),
        Transition(
            patch=cleared,
            reason="Unprocessable",
            message=f"{said} (the status holds only its phase: nothing more fits)",
            warning=True,
        ),
    )


def refused(status: AgentTaskStatus) -> Transition:
    """Count one more refused report in ``status.refusedReports`` (the event is separate)."""
    return Transition(
        patch={"refusedReports": (status.refused_reports or 0) + 1}, reason="", message=""
    )


def revoke(
    status: AgentTaskStatus, *, reason: str, message: str, now: datetime.datetime
) -> Transition:
    """The running attempt's claim is revoked (``reason``: Cancelled or DeadlineExceeded):
    its sidecar tells the agent; the task ends once the holder stops or its lease runs out
    (``end_revoked``)."""
    stamp = rfc3339(now)
    said = f"the claim of {status.worker} (token {status.fencing_token}) is revoked: {message}"
    return Transition(
        patch={
            "conditions": _conditions(status, _condition(REVOKED, True, reason, said, stamp)),
        },
        reason="Revoked",
        message=said,
        warning=reason != protocol.REVOKE_CANCELLED,
    )


def cancel(status: AgentTaskStatus, *, message: str, now: datetime.datetime) -> Transition:
    """The task ends Cancelled (a running attempt's, once its holder stopped)."""
    stamp = rfc3339(now)
    patch: dict[str, Any] = {
        "phase": TaskPhase.CANCELLED.value,
        "worker": None,
        "workerNamespace": None,
        "error": _error(protocol.REVOKE_CANCELLED, message, False),
        "finishedAt": stamp,
        "notBefore": None,
        "graceUntil": None,
        "lastTransitionTime": stamp,
        "conditions": _conditions(
            status, _condition(CANCELLED, True, "Cancelled", message, stamp), drop=(REVOKED,)
        ),
    }
    if status.phase is not None and status.phase.is_active:
        patch["history"] = _history(
            status, _entry(status, outcome=AttemptOutcome.CANCELLED, reason="Cancelled", now=stamp)
        )
    return Transition(patch=patch, reason="Cancelled", message=message)


def deadline_exceeded(
    status: AgentTaskStatus, *, message: str, now: datetime.datetime
) -> Transition:
    """activeDeadlineSeconds passed: Failed, reason DeadlineExceeded, never retried."""
    stamp = rfc3339(now)
    patch: dict[str, Any] = {
        "phase": TaskPhase.FAILED.value,
        "worker": None,
        "workerNamespace": None,
        "error": _error(protocol.REVOKE_DEADLINE, message, False),
        "finishedAt": stamp,
        "notBefore": None,
        "graceUntil": None,
        "lastTransitionTime": stamp,
        "conditions": _conditions(status, drop=(REVOKED,)),
    }
    if status.phase is not None and status.phase.is_active:
        patch["history"] = _history(
            status,
            _entry(
                status, outcome=AttemptOutcome.FAILED, reason=protocol.REVOKE_DEADLINE, now=stamp
            ),
        )
    return Transition(patch=patch, reason=protocol.REVOKE_DEADLINE, message=message, warning=True)


def requeue_refused(status: AgentTaskStatus, *, request: str, why: str) -> Transition:
    """A requeue request on a finished task that cannot go back to Pending (Succeeded,
    or unprocessable): answered once, visibly, so waits and the TTL see it finished."""
    return Transition(
        patch={"requeueHandled": requeue_id(request)},
        reason="RequeueRefused",
        message=f"requeue request {requeue_id(request)} refused: {why}",
        warning=True,
    )


def cancel_ignored(status: AgentTaskStatus, *, now: datetime.datetime) -> Transition:
    """spec.cancel set on a task that had already finished: said once, changes nothing."""
    stamp = rfc3339(now)
    message = f"cancel ignored: the task had already finished ({status.phase})"
    return Transition(
        patch={
            "conditions": _conditions(
                status, _condition(CANCELLED, False, "AlreadyFinished", message, stamp)
            )
        },
        reason="CancelIgnored",
        message=message,
    )
