"""Claim decisions: from what the operator sees of one task, the one thing to do next.

This is the operator's judgement, kept apart from its I/O the way client-go
keeps ``tryAcquireOrRenew`` apart from the lock it writes: each function takes
typed views (``agentq.views``) and what the operator observed on its own
monotonic clock (``Seen``) and returns a ``Decision`` -- a status transition to
commit with a compare-and-swap, a Lease to write or delete, a report to refuse,
a time to look again. The glue (``agentq.operator.controller``) applies it and,
when a write loses a race, asks again on fresh state.

The rules, in the order ``decide`` applies them to a task and its claim's Lease:

1. A task the operator cannot process (``TaskView.problem``: payload nested too
   deeply, object too large, unreadable spec) ends Failed with an
   ``Unprocessable`` condition, once; its Lease, if any, is deleted.
2. A Lease that belongs to an earlier task of the same name (``task-uid`` or
   owner differs) is deleted; nothing on it is ever committed to this task.
3. A report on the Lease is committed only if it is from the current claim:
   the task is Assigned/Running and the report's token and worker equal the
   status' token and worker and the Lease's holder and token. One that names
   the current claim exactly but cannot be decoded (a resultRef too long, a
   result too deep, an error of the wrong type) fails the attempt with a
   visible reason -- never a wedge. Anything else (a stale token, another
   worker, a token that is not a JSON integer) is refused, once per distinct
   report (an event, a counter, ``status.refusedReports``).
4. A task that is not Assigned/Running keeps no Lease (Held keeps it for the
   person who looks at it); a requeue request on a Held / DeadLettered /
   Failed task sends it back to Pending.
5. An Assigned/Running task's Lease must be its grant: missing or carrying an
   older token, it is (re)written -- never with a lower token than it has;
   carrying a higher or unreadable token, or another holder, or released by its
   holder, the attempt has failed (``LeaseTampered`` / ``LeaseReleased``): the
   task must not stay wedged on a Lease it cannot trust.
6. The current claim: Running at the holder's first renewal; the progress marker
   copied (at most every ``progress_interval``, cut to what status accepts); on
   expiry -- judged by the TASK's lease duration, and only when the watches are
   current (``Seen.judgeable``), and after the glue has re-read the Lease
   (``confirm_expiry``) -- Redispatch / GracePeriod / Hold; a renewal during a
   grace period ends it; a renewed Lease without progress for
   ``progressDeadlineSeconds`` fails the attempt.

Pure: no I/O, no clock (times are given), no randomness (a draw is given).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import math
from dataclasses import dataclass

from agentq import lifecycle, protocol
from agentq.lifecycle import Transition
from agentq.models import (
    REQUEUABLE_PHASES,
    AgentTaskStatus,
    AgentWorkerStatus,
    AttemptOutcome,
    ConditionStatus,
    LeaseExpiryPolicy,
    TaskPhase,
    WorkerPhase,
)
from agentq.protocol import (
    MAX_PROGRESS_CHARS,
    MAX_REASON_CHARS,
    ProtocolError,
    Report,
    bounded_text,
)
from agentq.views import LeaseView, TaskView, WorkerView

__all__ = [
    "Decision",
    "LeaseOp",
    "Policy",
    "Readiness",
    "Refusal",
    "Seen",
    "decide",
    "decide_pending",
    "lease_foreign",
    "readiness",
    "reserve_tokens",
    "revoked_by_operator",
    "worker_phase",
    "worker_status",
    "workers_to_avoid",
]


class LeaseOp(enum.Enum):
    """What to do with the task's Lease."""

    KEEP = "keep"
    WRITE_GRANT = "write-grant"  # create it, or raise an older one to the status' grant
    DELETE = "delete"  # after the transition commits, if there is one
    REVOKE = "revoke"  # mark the claim revoked (Decision.revoke says why) after it commits


@dataclass(frozen=True, slots=True)
class Refusal:
    """A report refused: recorded once per distinct report (event + counter + status)."""

    reason: str  # event reason
    message: str
    stale: bool  # counts in agentq_stale_reports_refused_total (a zombie's report)


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do about one task now. Everything empty means: nothing, wait."""

    transition: Transition | None = None
    lease: LeaseOp = LeaseOp.KEEP
    # The transition is because the Lease expired: the glue re-reads the Lease first and
    # drops the decision if it changed (a stalled watch looks exactly like a dead holder).
    confirm_expiry: bool = False
    refusal: Refusal | None = None
    # A grace period this transition starts: its deadline (monotonic) once committed.
    grace_deadline: float | None = None
    # The worker whose claim expired: not dispatched to until its worker Lease is renewed.
    suspect: str | None = None
    # Why the task is unprocessable (agentq_unprocessable_total{kind,reason}).
    unprocessable: tuple[str, str] | None = None
    # A report this transition commits (agentq_completions_total{outcome}).
    completion: str | None = None
    # When to look at the task again if nothing happens (monotonic).
    wake_at: float | None = None
    # With LeaseOp.REVOKE: why (protocol.REVOKE_CANCELLED / REVOKE_DEADLINE).
    revoke: str | None = None


@dataclass(frozen=True, slots=True)
class Seen:
    """What the operator observed about a task's claim, on its own clocks.

    ``changed_at`` / ``progress_changed_at``: when (monotonic) the Lease's record
    and its progress marker were last seen to change (None: Lease never seen).
    ``judgeable``: the watches are connected and current, so "no change seen"
    means "no change made". ``grace_deadline``: the grace period of the current
    token, if one was started (or recovered from ``status.graceUntil``).
    ``progress_written_at``: when the operator last wrote ``status.progress``.
    ``report_refused``: the report now on the Lease was refused already.
    """

    now: float
    wall: datetime.datetime
    rand: float
    changed_at: float | None = None
    progress_changed_at: float | None = None
    judgeable: bool = True
    grace_deadline: float | None = None
    progress_written_at: float | None = None
    report_refused: bool = False
    # The highest fencing token any operator issued (None: not known yet): a status token
    # above it was written by someone else.
    token_ceiling: int | None = None
    # When activeDeadlineSeconds passes, on our clock (None: no deadline, or not started).
    deadline_at: float | None = None
    # When the claim's Lease was first seen revoked, on our clock.
    revoked_at: float | None = None
    # Why the grant's Lease could not be written for a whole lease duration (its
    # namespace gone or terminating, or refusing the operator): None if it could.
    lease_unwritable: str | None = None
    # Why the API server refused the current claim's revoke mark for good (422: say, its
    # holder filled the Lease's annotations): None if it did not.
    revoke_refused: str | None = None


@dataclass(frozen=True, slots=True)
class Policy:
    """The operator's settings the decisions read."""

    max_reclaims: int = 3
    # Least time between two copies of a claim's progress marker into status: a
    # renewal alone never costs the operator a write.
    progress_interval: float = 10.0


def lease_foreign(task: TaskView, lease: LeaseView) -> bool:
    """The Lease belongs to an earlier task of this name (deleted and re-created)."""
    return lease.task_uid is not None and bool(task.uid) and lease.task_uid != task.uid


def _fail(task: TaskView, seen: Seen, policy: Policy, *, reason: str, message: str) -> Transition:
    spec = task.spec
    return lifecycle.fail_attempt(
        task.status,
        reason=reason,
        message=message,
        max_reclaims=spec.effective_max_reclaims(policy.max_reclaims),
        backoff=spec.retry_backoff,
        now=seen.wall,
        rand=seen.rand,
    )


def _judge_report(task: TaskView, lease: LeaseView, seen: Seen, policy: Policy) -> Decision | None:
    """Rule 3. None: no verdict (the report is refused or was already, go on)."""
    status = task.status
    text = lease.report or ""
    current_claim = (
        task.active
        and status.fencing_token is not None
        and lease.token == status.fencing_token
        and lease.holder is not None
        and lease.holder == status.worker
    )
    try:
        report = Report.decode(text)
    except ProtocolError as err:
        if current_claim and _names_the_claim(text, status.fencing_token, status.worker):
            return Decision(
                transition=_fail(
                    task, seen, policy, reason="InvalidReport", message=f"{err} (report refused)"
                ),
                lease=LeaseOp.DELETE,
                unprocessable=("Report", "InvalidReport"),
            )
        if seen.report_refused:
            return None
        return Decision(
            refusal=Refusal("ReportRefused", f"refused an unreadable report: {err}", stale=False)
        )
    if current_claim and report.token == status.fencing_token and report.worker == status.worker:
        if report.outcome == "Succeeded":
            transition = lifecycle.succeed(status, report, now=seen.wall)
        elif report.error is not None and not report.error.retryable:
            transition = lifecycle.fail_terminal(status, report, now=seen.wall)
        else:
            error = report.error or protocol.ErrorInfo(reason="Failed")
            transition = _fail(
                task,
                seen,
                policy,
                reason=error.reason,
                message=error.message or "the agent reported a retryable failure",
            )
        return Decision(transition=transition, lease=LeaseOp.DELETE, completion=report.outcome)
    if _committed(status, lease, report):
        return None  # the report of the attempt just committed, read again: acknowledged
    if seen.report_refused:
        return None
    return Decision(
        refusal=Refusal(
            "StaleReportRefused",
            (
                f"refused a {report.outcome} report from {report.worker} with token "
                f"{report.token}: the current attempt is {status.attempt} on {status.worker} "
                f"with token {status.fencing_token} (phase {status.phase})"
            ),
            stale=True,
        )
    )


def _committed(status: AgentTaskStatus, lease: LeaseView, report: Report) -> bool:
    """The report is the one the operator committed for its attempt: it is on that
    attempt's own Lease (not yet deleted), and the attempt's history entry (its token,
    its worker) records the outcome it reports. A zombie's report is neither: it is on a
    later attempt's Lease, or its outcome is not what was recorded (a reclaim)."""
    if lease.token is None or lease.token != report.token:
        return False
    if report.outcome == "Succeeded":
        outcome, reason = AttemptOutcome.SUCCEEDED, None
    else:
        outcome = AttemptOutcome.FAILED
        reason = bounded_text(report.error.reason if report.error else "Failed", MAX_REASON_CHARS)
    return any(
        entry.token == report.token
        and entry.worker == report.worker
        and entry.outcome is outcome
        and (reason is None or entry.reason == reason)
        for entry in status.history or ()
    )


def _names_the_claim(text: str, token: int | None, worker: str | None) -> bool:
    """An undecodable report that still names the current attempt (token and worker
    exactly): its holder's, so the attempt fails visibly. One that does not (a token of
    ``true``, ``"7"`` or ``7.0``, another worker) is refused like a stale one."""
    try:
        body = protocol.decode_json(text, what="report")
    except ProtocolError:
        return False
    if not isinstance(body, dict):
        return False
    named = body.get("token")
    return protocol.is_json_int(named) and named == token and body.get("worker") == worker


def decide(task: TaskView, lease: LeaseView | None, seen: Seen, policy: Policy) -> Decision:
    """The next step for ``task`` given its claim's Lease (the module docstring's rules);
    a task with an activeDeadlineSeconds still ahead is looked at again when it passes."""
    decision = _decide(task, lease, seen, policy)
    deadline = seen.deadline_at
    if deadline is None or deadline <= seen.now or decision.transition is not None:
        return decision
    phase = task.status.phase
    if phase is not None and phase.is_final:
        return decision
    wake = deadline if decision.wake_at is None else min(decision.wake_at, deadline)
    return dataclasses.replace(decision, wake_at=wake)


def _decide(task: TaskView, lease: LeaseView | None, seen: Seen, policy: Policy) -> Decision:
    status = task.status
    phase = status.phase
    # 1. unprocessable
    if task.problem is not None:
        if phase is not None and phase.is_final:
            return _answer_finished(
                task,
                lease,
                seen,
                why=(
                    f"the task is unprocessable ({task.problem.reason}); create it again "
                    "with a spec that can be processed"
                ),
            )
        return Decision(
            transition=lifecycle.unprocessable(
                status, reason=task.problem.reason, message=task.problem.message, now=seen.wall
            ),
            lease=LeaseOp.DELETE if lease is not None else LeaseOp.KEEP,
            unprocessable=("AgentTask", task.problem.reason),
        )
    # 1b. a fencing token no operator issued: nothing of this task can be trusted
    token = status.fencing_token or 0
    if seen.token_ceiling is not None and token > seen.token_ceiling:
        if phase is not None and phase.is_final:
            return _answer_finished(
                task,
                lease,
                seen,
                why=(
                    f"status.fencingToken {token} was not issued by the operator; delete "
                    "the task and create it again"
                ),
            )
        return Decision(
            transition=lifecycle.unprocessable(
                status,
                reason="FencingTokenForged",
                message=(
                    f"status.fencingToken {token} is above every token the operator issued "
                    f"({seen.token_ceiling}): it was written by someone else; the task is not "
                    "granted again (agentq requeue after deleting and re-creating it)"
                ),
                now=seen.wall,
            ),
            lease=LeaseOp.DELETE if lease is not None else LeaseOp.KEEP,
            unprocessable=("AgentTask", "FencingTokenForged"),
        )
    # 2. a Lease of an earlier task of this name
    if lease is not None and lease_foreign(task, lease):
        return Decision(lease=LeaseOp.DELETE)
    # 3. the report
    refusal: Refusal | None = None
    if lease is not None and lease.report:
        verdict = _judge_report(task, lease, seen, policy)
        if verdict is not None and verdict.refusal is None:
            return verdict
        refusal = verdict.refusal if verdict is not None else None
    # 4. no claim
    if not task.active:
        transition = None
        request = _unanswered_requeue(task)
        if request is not None and phase in REQUEUABLE_PHASES:
            transition = lifecycle.requeue(status, now=seen.wall, request=request)
            return Decision(
                transition=transition,
                lease=LeaseOp.DELETE if lease is not None else LeaseOp.KEEP,
                refusal=refusal,
            )
        if request is not None and phase is not None and phase.is_final:
            # Succeeded: nothing to redrive. Answered, or waits and the TTL would wait
            # for good on a request no one will act on.
            return Decision(
                transition=lifecycle.requeue_refused(
                    status,
                    request=request,
                    why=f"a {phase} task is not requeued; create it again to run it again",
                ),
                lease=LeaseOp.DELETE if lease is not None else LeaseOp.KEEP,
                refusal=refusal,
            )
        ended = _stop_unclaimed(task, seen)
        if ended is not None:
            return Decision(
                transition=ended,
                lease=LeaseOp.DELETE if lease is not None else LeaseOp.KEEP,
                refusal=refusal,
            )
        keep = lease is None or phase is TaskPhase.HELD
        wake = seen.deadline_at if phase in (None, TaskPhase.PENDING, TaskPhase.HELD) else None
        return Decision(
            lease=LeaseOp.KEEP if keep else LeaseOp.DELETE, refusal=refusal, wake_at=wake
        )
    # 5. the Lease must be the grant
    token = status.fencing_token or 0
    stop = _stop_reason(task, seen)
    if lease is None or (lease.token is not None and lease.token < token):
        if stop is not None:
            # Cancelled, or past its deadline, before its Lease was written: no agent has
            # seen this attempt, nothing to revoke.
            return Decision(transition=_stopped(task, stop, seen), refusal=refusal)
        if seen.lease_unwritable is not None:
            # No Lease, so nothing to expire: the attempt ends as an expired claim would.
            return Decision(transition=_unwritable(task, seen, policy), refusal=refusal)
        # A grant whose Lease write did not happen (the operator died between its two
        # writes), or the previous attempt's Lease not yet deleted: write this grant's.
        return Decision(lease=LeaseOp.WRITE_GRANT, refusal=refusal)
    revoked = revoked_by_operator(task, lease)
    if revoked is not lease.revoked:
        lease = dataclasses.replace(lease, revoked=revoked)
    if lease.revoked is not None and lease.token == token and lease.holder is None:
        # The holder stopped, as its revoked claim asked: the task ends.
        return Decision(
            transition=_stopped(task, lease.revoked, seen), lease=LeaseOp.DELETE, refusal=refusal
        )
    if lease.token is None or lease.token != token or lease.holder != status.worker:
        if lease.holder is None and lease.token == token:
            reason, message = "LeaseReleased", f"{status.worker} released its claim"
        else:
            reason, message = (
                "LeaseTampered",
                (
                    f"the claim's Lease {lease.name} says holder {lease.holder!r} with token "
                    f"{lease.token_text!r}, but the attempt is {status.worker!r} with token "
                    f"{token}: the Lease was changed by someone else"
                ),
            )
        return Decision(
            transition=_fail(task, seen, policy, reason=reason, message=message),
            lease=LeaseOp.DELETE,
            refusal=refusal,
            unprocessable=("Lease", reason) if reason == "LeaseTampered" else None,
        )
    # 6. the current claim: revoked (cancel, deadline), or running
    if lease.revoked is not None or stop is not None:
        return _revoked_claim(task, lease, stop, seen, refusal)
    return _current_claim(task, lease, seen, policy, refusal)


def _unanswered_requeue(task: TaskView) -> str | None:
    """The task's ``agentq.dev/requeue`` request if the operator has not answered it."""
    request = task.requeue
    if request and protocol.requeue_id(request) != task.status.requeue_handled:
        return request
    return None


def _answer_finished(task: TaskView, lease: LeaseView | None, seen: Seen, *, why: str) -> Decision:
    """A finished task that cannot run again (unprocessable, or a token no operator
    issued): a requeue request is refused with ``why``, a cancel ignored, each said once,
    so that the task settles (waits end, its TTL runs) instead of asking for good."""
    op = LeaseOp.DELETE if lease is not None else LeaseOp.KEEP
    request = _unanswered_requeue(task)
    if request is not None:
        return Decision(
            transition=lifecycle.requeue_refused(task.status, request=request, why=why), lease=op
        )
    return Decision(transition=_stop_unclaimed(task, seen), lease=op)


def revoked_by_operator(task: TaskView, lease: LeaseView) -> str | None:
    """Why the operator revoked the claim whose Lease is ``lease``: the Lease's
    ``agentq.dev/revoked`` only if the task's status says the operator revoked it (its
    ``Revoked`` condition, written before the annotation), with the condition's reason.
    The annotation is on the holder's side of the Lease (the admission policy keeps only
    the token, attempt and task UID): a holder that wrote it itself must not end its
    task Cancelled that no one cancelled, nor step out of its progress deadline."""
    if lease.revoked is None:
        return None
    held = lifecycle.condition(task.status, lifecycle.REVOKED)
    if held is None or not held[0]:
        return None
    reason = lifecycle.condition_reason_of(task.status, lifecycle.REVOKED)
    if reason in (protocol.REVOKE_CANCELLED, protocol.REVOKE_DEADLINE):
        return reason
    return lease.revoked


def settled(task: TaskView) -> bool:
    """A finished task that needs no decision: no requeue to handle, no cancel to answer.
    The operator keeps no record of it (only when to delete it: ``ttlSecondsAfterFinished``)."""
    phase = task.status.phase
    if phase is None or not phase.is_final:
        return False
    if _unanswered_requeue(task) is not None:
        return False
    return not (
        task.spec.cancel
        and phase is not TaskPhase.CANCELLED
        and lifecycle.condition(task.status, lifecycle.CANCELLED) is None
    )


def _stop_reason(task: TaskView, seen: Seen) -> str | None:
    """Why the task must stop now: a revocation already decided (its ``Revoked``
    condition; only a requeue undoes it, so a cancel unset before the Lease was marked
    does not leave the attempt half revoked), cancelled, or past its
    activeDeadlineSeconds."""
    held = lifecycle.condition(task.status, lifecycle.REVOKED)
    if held is not None and held[0]:
        reason = lifecycle.condition_reason_of(task.status, lifecycle.REVOKED)
        if reason in (protocol.REVOKE_CANCELLED, protocol.REVOKE_DEADLINE):
            return reason
    if task.spec.cancel:
        return protocol.REVOKE_CANCELLED
    if seen.deadline_at is not None and seen.now >= seen.deadline_at:
        return protocol.REVOKE_DEADLINE
    return None


def _stopped(task: TaskView, reason: str, seen: Seen) -> Transition:
    """The terminal transition of a task stopped for ``reason``."""
    if reason == protocol.REVOKE_DEADLINE:
        return lifecycle.deadline_exceeded(
            task.status,
            message=f"activeDeadlineSeconds ({task.spec.active_deadline_seconds}s) passed",
            now=seen.wall,
        )
    return lifecycle.cancel(task.status, message="cancelled (spec.cancel)", now=seen.wall)


def _stop_unclaimed(task: TaskView, seen: Seen) -> Transition | None:
    """A task without a claim that must stop ends at once; a finished one ignores a cancel
    (saying so once)."""
    phase = task.status.phase
    if phase is not None and phase.is_final:
        if (
            task.spec.cancel
            and phase is not TaskPhase.CANCELLED
            and lifecycle.condition(task.status, lifecycle.CANCELLED) is None
        ):
            return lifecycle.cancel_ignored(task.status, now=seen.wall)
        return None
    reason = _stop_reason(task, seen)
    return None if reason is None else _stopped(task, reason, seen)


def _revoked_claim(
    task: TaskView, lease: LeaseView, stop: str | None, seen: Seen, refusal: Refusal | None
) -> Decision:
    """A claim that must stop: revoked (its sidecar tells the agent, then lets the Lease
    go), then ended once its holder stopped renewing, or at the latest a lease duration
    after the revocation was seen, whatever its holder does."""
    status, duration = task.status, task.spec.lease_duration_seconds
    if lease.revoked is None:
        assert stop is not None
        held = lifecycle.condition(status, lifecycle.REVOKED)
        transition = None
        if held is None or not held[0]:
            transition = lifecycle.revoke(
                status,
                reason=stop,
                message=(
                    "the task was cancelled"
                    if stop == protocol.REVOKE_CANCELLED
                    else f"activeDeadlineSeconds ({task.spec.active_deadline_seconds}s) passed"
                ),
                now=seen.wall,
            )
        if seen.revoke_refused is not None and transition is None:
            # The mark cannot be written, so the holder would never hear and could renew
            # for good: the claim ends now, its Lease deleted (the holder loses it).
            message = (
                f"the revoke mark could not be written on the claim's Lease "
                f"{lease.name}, so it is deleted and its holder {status.worker} loses it: "
                f"{seen.revoke_refused}"
            )
            stopped = _stopped(task, stop, seen)
            return Decision(
                transition=dataclasses.replace(
                    stopped,
                    extra_events=(("RevokeRefused", message, True), *stopped.extra_events),
                ),
                lease=LeaseOp.DELETE,
                refusal=refusal,
                unprocessable=("Lease", "RevokeRefused"),
            )
        return Decision(transition=transition, lease=LeaseOp.REVOKE, revoke=stop, refusal=refusal)
    ended = Decision(
        transition=_stopped(task, lease.revoked, seen), lease=LeaseOp.DELETE, refusal=refusal
    )
    dues: list[float] = []
    if seen.revoked_at is not None:
        # At the latest a lease duration after the revocation, renewed or not.
        bound = seen.revoked_at + duration
        if seen.now >= bound:
            return ended
        dues.append(bound)
    if seen.changed_at is not None:
        # The holder stopped renewing (judged as any expiry: on current watches, and
        # confirmed by reading the Lease again).
        expires = seen.changed_at + duration
        if seen.now >= expires and seen.judgeable:
            return Decision(
                transition=ended.transition,
                lease=LeaseOp.DELETE,
                confirm_expiry=True,
                refusal=refusal,
            )
        if seen.now < expires:
            dues.append(expires)
    return Decision(refusal=refusal, wake_at=min(dues) if dues else None)


def _current_claim(
    task: TaskView, lease: LeaseView, seen: Seen, policy: Policy, refusal: Refusal | None
) -> Decision:
    status, spec = task.status, task.spec
    wakes: list[float] = []
    steps: list[Transition] = []
    if status.phase is TaskPhase.ASSIGNED and lease.renew_time != lease.acquire_time:
        steps.append(lifecycle.start(status, now=seen.wall))

    expires_at = None if seen.changed_at is None else seen.changed_at + spec.lease_duration_seconds
    expired = expires_at is not None and seen.now >= expires_at
    if expires_at is not None and not expired:
        wakes.append(expires_at)

    outcome: Decision | None = None
    if expired and seen.judgeable:
        outcome = _on_expiry(task, seen, policy, steps)
        if outcome is None and seen.grace_deadline is not None:
            wakes.append(seen.grace_deadline)
    elif not expired and status.grace_until is not None:
        steps.append(lifecycle.end_grace(status))  # the holder came back within its grace
    elif (
        not expired
        and status.phase is TaskPhase.RUNNING
        and spec.progress_deadline_seconds is not None
        and seen.progress_changed_at is not None
    ):
        deadline = seen.progress_changed_at + spec.progress_deadline_seconds
        if seen.now >= deadline:
            outcome = Decision(
                transition=lifecycle.merge(
                    [
                        *steps,
                        _fail(
                            task,
                            seen,
                            policy,
                            reason="ProgressDeadlineExceeded",
                            message=(
                                f"no progress for {spec.progress_deadline_seconds}s "
                                "while the lease was renewed"
                            ),
                        ),
                    ]
                ),
                lease=LeaseOp.DELETE,
            )
        else:
            wakes.append(deadline)
    if outcome is not None:
        return Decision(
            transition=outcome.transition,
            lease=outcome.lease,
            confirm_expiry=outcome.confirm_expiry,
            refusal=refusal,
            grace_deadline=outcome.grace_deadline,
            suspect=outcome.suspect,
            wake_at=outcome.wake_at,
        )

    marker = lease.progress
    if marker is not None and bounded_text(marker, MAX_PROGRESS_CHARS) != status.progress:
        due = (
            seen.now
            if seen.progress_written_at is None
            else seen.progress_written_at + policy.progress_interval
        )
        if steps or seen.now >= due:
            steps.append(lifecycle.progress(status, marker=marker))
        else:
            wakes.append(due)
    return Decision(
        transition=lifecycle.merge(steps),
        refusal=refusal,
        wake_at=min(wakes) if wakes else None,
    )


def _unwritable(task: TaskView, seen: Seen, policy: Policy) -> Transition:
    """The grant's Lease could not be written for a lease duration: the attempt failed
    (counted), with an event of its own saying why."""
    message = (
        f"the Lease of the claim of {task.status.worker} could not be written for "
        f"{task.spec.lease_duration_seconds}s: {seen.lease_unwritable}"
    )
    failed = _fail(task, seen, policy, reason="LeaseUnwritable", message=message)
    return Transition(
        patch=failed.patch,
        reason=failed.reason,
        message=failed.message,
        warning=failed.warning,
        extra_events=(("LeaseUnwritable", message, True), *failed.extra_events),
    )


def _on_expiry(
    task: TaskView, seen: Seen, policy: Policy, steps: list[Transition]
) -> Decision | None:
    """The claim's Lease expired (judged by the task's own lease duration)."""
    status, spec = task.status, task.spec
    worker = status.worker
    message = f"lease held by {worker} was not renewed in time"
    policy_name = spec.on_lease_expiry
    if policy_name is LeaseExpiryPolicy.HOLD:
        if status.phase is TaskPhase.HELD:
            return None
        return Decision(
            transition=lifecycle.hold(status, reason="LeaseExpired", now=seen.wall),
            confirm_expiry=True,
            suspect=worker,
        )
    if policy_name is LeaseExpiryPolicy.GRACE_PERIOD:
        seconds = float(spec.grace_period_seconds or 0)
        if seen.grace_deadline is None:
            until = seen.wall + datetime.timedelta(seconds=seconds)
            return Decision(
                transition=lifecycle.merge(
                    [*steps, lifecycle.grace(status, until=until, now=seen.wall)]
                ),
                confirm_expiry=True,
                grace_deadline=seen.now + seconds,
                suspect=worker,
                wake_at=seen.now + seconds,
            )
        if seen.now < seen.grace_deadline:
            return None
        message += f", nor reported within the {spec.grace_period_seconds}s grace period"
    failed = _fail(task, seen, policy, reason="LeaseExpired", message=message)
    # The expiry is an event of its own, before the Reclaimed / DeadLettered it causes.
    failed = Transition(
        patch=failed.patch,
        reason=failed.reason,
        message=failed.message,
        warning=failed.warning,
        extra_events=(("LeaseExpired", message, True), *failed.extra_events),
    )
    return Decision(
        transition=lifecycle.merge([*steps, failed]),
        lease=LeaseOp.DELETE,
        confirm_expiry=True,
        suspect=worker,
    )


def decide_pending(
    task: TaskView,
    missing: str | None,
    *,
    wall: datetime.datetime,
    verdict: tuple[str, str] | None = None,
    budget: tuple[str, str] | None = None,
    budget_wait: tuple[str, str] | None = None,
) -> Transition | None:
    """A pending task's conditions. ``Queued`` for a task naming an AgentQueue: False
    (the ``verdict``'s reason and message) while the queue does not admit it -- nothing
    else is judged then --, True once it does. ``Unschedulable``: set while ``missing``
    says which capabilities no worker of the namespace offers, cleared once one does.
    ``Budgeted`` for a task naming AgentBudgets: False with the ``budget`` verdict
    (none of them can ever admit it as they are) or the ``budget_wait`` (refused at the
    head of its set for a while), True again once a verdict is lifted."""
    queue = _queue_conditions(task, missing, wall, verdict)
    if not task.spec.budgets:
        return queue
    status = queue.apply(task.status) if queue is not None else task.status
    more = _budgeted(status, budget, budget_wait, wall)
    if more is None:
        return queue
    return more if queue is None else queue.then(more)


def _budgeted(
    status: AgentTaskStatus,
    verdict: tuple[str, str] | None,
    wait: tuple[str, str] | None,
    wall: datetime.datetime,
) -> Transition | None:
    held = lifecycle.condition(status, lifecycle.BUDGETED)
    said = verdict or wait
    if said is not None:
        reason, message = said
        if held is not None and not held[0] and held[1] == message:
            return None
        return lifecycle.not_budgeted(
            status, reason=reason, message=message, now=wall, warning=verdict is not None
        )
    lifted = (
        held is not None
        and not held[0]
        and lifecycle.condition_reason_of(status, lifecycle.BUDGETED) in _BUDGET_VERDICTS
    )
    if lifted:
        return lifecycle.budgeted(status, message="its AgentBudgets may admit it", now=wall)
    return None


# The reasons of a Budgeted verdict (``scheduler.budgets``: no time cures them).
_BUDGET_VERDICTS = frozenset({"BudgetNotFound", "EstimateExceedsLimit"})


def _queue_conditions(
    task: TaskView,
    missing: str | None,
    wall: datetime.datetime,
    verdict: tuple[str, str] | None,
) -> Transition | None:
    if task.spec.queue is not None:
        queued = lifecycle.condition(task.status, lifecycle.QUEUED)
        if verdict is not None:
            reason, message = verdict
            if queued is not None and not queued[0] and queued[1] == message:
                return None
            return lifecycle.not_queued(task.status, reason=reason, message=message, now=wall)
        if queued is not None and not queued[0]:
            admitted = lifecycle.queued(
                task.status, message=f"AgentQueue {task.spec.queue} admits it", now=wall
            )
            # (judged on the status with Queued True: one patch of the conditions)
            more = _unschedulable(admitted.apply(task.status), missing, wall)
            return admitted if more is None else admitted.then(more)
    return _unschedulable(task.status, missing, wall)


def _unschedulable(
    status: AgentTaskStatus, missing: str | None, wall: datetime.datetime
) -> Transition | None:
    held = lifecycle.condition(status, lifecycle.UNSCHEDULABLE)
    if missing is not None:
        if held is not None and held[0] and held[1] == missing:
            return None
        return lifecycle.unschedulable(status, message=missing, now=wall)
    if held is not None and held[0]:
        return lifecycle.schedulable(
            status, message="a worker that offers every required capability exists", now=wall
        )
    return None


def workers_to_avoid(status: AgentTaskStatus) -> frozenset[str]:
    """The workers a (re-)dispatch of the task should prefer not to use: those of its
    attempts that ended without success (``Failed``: an expired or released Lease, a
    failure report, a progress deadline; ``Held``: an expired Lease held for a person),
    from the bounded ``status.history``. The scheduling core prefers any other eligible
    worker and falls back to one of these only when no other can take the task."""
    return frozenset(
        entry.worker
        for entry in status.history or ()
        if entry.worker and entry.outcome in (AttemptOutcome.FAILED, AttemptOutcome.HELD)
    )


def missing_capabilities(
    required: frozenset[str], offered: list[frozenset[str]], namespace: str
) -> str | None:
    """None if some worker offers all of ``required``; else a message naming what is missing."""
    if any(required <= caps for caps in offered):
        return None
    best = max(offered, key=lambda caps: (len(required & caps), sorted(caps)), default=frozenset())
    missing = sorted(required - best)
    anywhere = sorted(required - frozenset().union(*offered)) if offered else sorted(required)
    if not offered:
        return (
            f"no AgentWorker in namespace {namespace} yet; required: {', '.join(sorted(required))}"
        )
    if anywhere:
        return (
            f"no AgentWorker in namespace {namespace} offers {', '.join(anywhere)} "
            f"(required: {', '.join(sorted(required))})"
        )
    return (
        f"no single AgentWorker in namespace {namespace} offers all of "
        f"{', '.join(sorted(required))}; the closest lacks {', '.join(missing)}"
    )


# -- workers ------------------------------------------------------------------------


class Readiness(enum.Enum):
    """Why a worker is (not) Ready; the Ready condition's reason."""

    READY = "LeaseRenewed"
    PAUSED = "Paused"
    DRAINING = "Draining"  # its sidecar is stopping (the pod goes away): claims kept
    LEASE_MISSING = "LeaseMissing"
    LEASE_NOT_LABELLED = "LeaseNotLabelled"
    LEASE_RELEASED = "LeaseReleased"
    LEASE_STALE = "LeaseStale"
    SUSPECT = "ClaimExpired"
    UNPROCESSABLE = "Unprocessable"


def readiness(
    worker: WorkerView,
    lease: LeaseView | None,
    *,
    fresh: bool,
    unlabelled: bool,
    suspect: bool,
) -> tuple[Readiness, str]:
    """The worker's readiness and a message naming what is missing.

    ``fresh``: its worker Lease was seen renewed within the Lease's duration.
    ``unlabelled``: a Lease of the worker Lease's name exists without the label the
    operator's watch selects on (found by a direct read). ``suspect``: a claim it
    held expired and its worker Lease has not been renewed since.
    """
    lease_name = protocol.worker_lease_name(worker.name)
    if worker.spec is None:
        problem = worker.problem.message if worker.problem else "unreadable spec"
        return Readiness.UNPROCESSABLE, problem
    if worker.spec.paused:
        return Readiness.PAUSED, "paused: no new tasks"
    if lease is None:
        if unlabelled:
            return (
                Readiness.LEASE_NOT_LABELLED,
                f"Lease {lease_name} exists but lacks the label "
                f"{protocol.LABEL_LEASE_KIND}={protocol.LEASE_KIND_WORKER} the operator "
                "selects worker Leases by",
            )
        return Readiness.LEASE_MISSING, f"no Lease {lease_name}: is the worker's sidecar running?"
    if lease.holder is None:
        return Readiness.LEASE_RELEASED, f"Lease {lease_name} was released by its holder"
    if not fresh:
        return (
            Readiness.LEASE_STALE,
            f"Lease {lease_name} (holder {lease.holder}) was not renewed within its "
            f"{lease.duration or '?'}s",
        )
    if suspect:
        return (
            Readiness.SUSPECT,
            f"a claim it held expired; waiting for Lease {lease_name} to be renewed again",
        )
    if lease.draining:
        return (
            Readiness.DRAINING,
            f"draining: {lease.holder} is stopping (its pod goes away); it finishes its "
            "tasks and gets no new one",
        )
    return Readiness.READY, f"Lease {lease_name} is renewed by {lease.holder}"


def _finite(value: float, digits: int = 6) -> float:
    """A number JSON and the API server accept: finite, rounded (a denormal weight can
    make a deficit infinite)."""
    if math.isnan(value):
        return 0.0
    if math.isinf(value):
        return math.copysign(1e300, value)
    return round(max(-1e300, min(1e300, value)), digits)


def worker_phase(reason: Readiness) -> WorkerPhase:
    """The phase a worker's readiness gives it."""
    if reason in (Readiness.PAUSED, Readiness.DRAINING):
        return WorkerPhase.DRAINING
    if reason is Readiness.READY:
        return WorkerPhase.READY
    return WorkerPhase.NOT_READY


def worker_status(
    worker: WorkerView,
    ready: tuple[Readiness, str],
    *,
    in_flight: int,
    in_flight_cost: float,
    served_cost: float,
    deficit: float,
    tasks: frozenset[str],
    stamp: str,
) -> dict[str, object]:
    """The AgentWorker status the operator publishes (a merge patch of what differs is the
    glue's business); the Ready condition's transition time moves only when it flips."""
    reason, message = ready
    phase = worker_phase(reason)
    is_ready = reason is Readiness.READY
    previous = next((c for c in worker.status.conditions or [] if c.type == "Ready"), None)
    changed = previous is None or (previous.status is ConditionStatus.TRUE) != is_ready
    transition_time = stamp
    if not changed and previous is not None:
        transition_time = previous.last_transition_time.strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "phase": phase.value,
        "inFlight": in_flight,
        "inFlightCost": _finite(in_flight_cost),
        "servedCost": _finite(served_cost),
        "deficit": _finite(deficit),
        # A task of another namespace as <namespace>/<task> (the core knows it by its
        # claim id, <namespace>~<task>).
        "assignedTasks": sorted(map(protocol.assigned_name, tasks))[:100],
        "conditions": [
            *(c.to_dict() for c in worker.status.conditions or [] if c.type != "Ready"),
            {
                "type": "Ready",
                "status": "True" if is_ready else "False",
                "reason": reason.value,
                "message": message,
                "lastTransitionTime": transition_time,
            },
        ],
    }


def same_worker_status(old: AgentWorkerStatus, new: dict[str, object]) -> bool:
    """``new`` says nothing ``old`` does not (so it need not be written)."""
    current = old.to_dict()
    return all(current.get(k) == v for k, v in new.items())


# -- fencing tokens -------------------------------------------------------------------


def reserve_tokens(ceiling: int, floor: int, block: int) -> tuple[int, int]:
    """The next block of fencing tokens: ``(first, new_ceiling)``.

    ``ceiling`` is the highest token any operator may have issued (the durable
    counter); ``floor`` the highest token seen anywhere (task statuses, Lease
    annotations -- including one raised by hand). The block starts above both, so
    every token issued from it is strictly greater than every token issued before,
    for any task, whichever leader issued it.
    """
    if block < 1:
        raise ValueError("a block holds at least one token")
    first = max(ceiling, floor, 0) + 1
    return first, first + block - 1
