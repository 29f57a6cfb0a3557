"""The AgentTask state machine, as pure functions from a task to a status patch.

Every transition the operator makes is decided here and returned as a value: a
JSON merge patch for ``status`` (and the event to record). The glue applies it
with a resourceVersion precondition, so a decision made on a stale snapshot is
refused by the API server instead of overwriting newer state.

Phases: Pending -> Assigned -> Running -> Succeeded | Failed | DeadLettered,
with Pending again after a failed attempt (expired lease, retryable failure,
progress deadline exceeded) while ``reclaims <= maxReclaims``, and Held for
``onLeaseExpiry: Hold``. Counting: ``reclaims`` is the number of failed
attempts so far; the attempt that makes it exceed ``maxReclaims`` dead-letters
the task, so a poison task gets exactly ``maxReclaims + 1`` attempts.
"""

from __future__ import annotations

import datetime
import random
from dataclasses import dataclass, field
from typing import Any

from agentq.clock import rfc3339
from agentq.models import RetryBackoff, condition_reason
from agentq.protocol import Report

HISTORY_LIMIT = 20
ACTIVE_PHASES = frozenset({"Assigned", "Running"})


@dataclass(frozen=True)
class Transition:
    """A decided change: the status merge patch and the event that records it."""

    patch: dict[str, Any]
    reason: str
    message: str
    warning: bool = False
    extra_events: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    @property
    def phase(self) -> str | None:
        phase = self.patch.get("phase")
        return str(phase) if phase is not None else None


def _history(status: dict[str, Any], entry: dict[str, Any]) -> list[dict[str, Any]]:
    history = [*list(status.get("history") or []), entry]
    return history[-HISTORY_LIMIT:]


def _condition(kind: str, ok: bool, reason: str, message: str, now: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if ok else "False",
        # Agents report free-form reasons; a condition's reason must be a CamelCase word.
        "reason": condition_reason(reason),
        "message": message,
        "lastTransitionTime": now,
    }


def _conditions(status: dict[str, Any], *new: dict[str, Any]) -> list[dict[str, Any]]:
    kinds = {c["type"] for c in new}
    kept = [c for c in status.get("conditions") or [] if c.get("type") not in kinds]
    return [*kept, *new]


def grant(
    status: dict[str, Any], *, worker: str, lease_name: str, now: datetime.datetime
) -> Transition:
    """Assign the task to ``worker`` with a fencing token above every earlier one."""
    token = int(status.get("fencingToken") or 0) + 1
    attempt = int(status.get("attempt") or 0) + 1
    stamp = rfc3339(now)
    return Transition(
        patch={
            "phase": "Assigned",
            "worker": worker,
            "attempt": attempt,
            "reclaims": int(status.get("reclaims") or 0),
            "fencingToken": token,
            "leaseName": lease_name,
            "assignedAt": stamp,
            "startedAt": None,
            "notBefore": None,
            "graceUntil": None,
            "progress": None,
            "lastTransitionTime": stamp,
            "conditions": _conditions(
                status, _condition("Assigned", True, "Assigned", f"assigned to {worker}", stamp)
            ),
        },
        reason="Assigned",
        message=f"attempt {attempt} assigned to worker {worker} with fencing token {token}",
    )


def start(status: dict[str, Any], *, now: datetime.datetime) -> Transition:
    """The holder renewed its claim for the first time: the attempt runs."""
    stamp = rfc3339(now)
    return Transition(
        patch={"phase": "Running", "startedAt": stamp, "lastTransitionTime": stamp},
        reason="Running",
        message=f"worker {status.get('worker')} started attempt {status.get('attempt')}",
    )


def progress(_status: dict[str, Any], *, marker: str) -> Transition:
    return Transition(patch={"progress": marker}, reason="", message="")


def succeed(status: dict[str, Any], report: Report, *, now: datetime.datetime) -> Transition:
    stamp = rfc3339(now)
    return Transition(
        patch={
            "phase": "Succeeded",
            "result": report.result,
            "resultRef": report.result_ref,
            "error": None,
            "finishedAt": stamp,
            "lastTransitionTime": stamp,
            "history": _history(
                status, _entry(status, outcome="Succeeded", reason="Completed", now=stamp)
            ),
            "conditions": _conditions(
                status,
                _condition("Complete", True, "Succeeded", "the agent reported success", stamp),
            ),
        },
        reason="Succeeded",
        message=f"worker {report.worker} completed attempt {status.get('attempt')}",
    )


def _entry(status: dict[str, Any], *, outcome: str, reason: str, now: str) -> dict[str, Any]:
    return {
        "worker": status.get("worker"),
        "token": status.get("fencingToken"),
        "attempt": status.get("attempt"),
        "outcome": outcome,
        "reason": reason,
        "time": now,
    }


def fail_attempt(
    status: dict[str, Any],
    *,
    reason: str,
    message: str,
    max_reclaims: int,
    backoff: RetryBackoff,
    now: datetime.datetime,
    rng: random.Random,
    error: dict[str, Any] | None = None,
) -> Transition:
    """A failed attempt (lease expired, retryable failure, progress deadline exceeded).

    Back to Pending after a backoff while failures stay within ``max_reclaims``;
    otherwise DeadLettered.
    """
    stamp = rfc3339(now)
    reclaims = int(status.get("reclaims") or 0) + 1
    history = _history(status, _entry(status, outcome="Failed", reason=reason, now=stamp))
    common: dict[str, Any] = {
        "reclaims": reclaims,
        "worker": None,
        "history": history,
        "lastTransitionTime": stamp,
        "graceUntil": None,
        "error": error or {"reason": reason, "message": message, "retryable": True},
    }
    if reclaims > max_reclaims:
        return Transition(
            patch={
                **common,
                "phase": "DeadLettered",
                "finishedAt": stamp,
                "notBefore": None,
                "conditions": _conditions(
                    status,
                    _condition(
                        "DeadLettered",
                        True,
                        reason,
                        f"{reclaims} failed attempts exceed maxReclaims={max_reclaims}",
                        stamp,
                    ),
                ),
            },
            reason="DeadLettered",
            message=(
                f"attempt {status.get('attempt')} failed ({reason}: {message}); "
                f"{reclaims} failed attempts exceed maxReclaims={max_reclaims}"
            ),
            warning=True,
            extra_events=(("Reclaimed", f"{reason}: {message}"),),
        )
    delay = backoff.delay_seconds(reclaims, rand=rng.random())
    return Transition(
        patch={
            **common,
            "phase": "Pending",
            "notBefore": rfc3339(now + datetime.timedelta(seconds=delay)),
        },
        reason="Reclaimed",
        message=(
            f"attempt {status.get('attempt')} on {status.get('worker')} failed ({reason}: "
            f"{message}); failure {reclaims} of at most {max_reclaims + 1}, "
            f"retrying in {delay:.1f}s"
        ),
        warning=True,
    )


def fail_terminal(status: dict[str, Any], report: Report, *, now: datetime.datetime) -> Transition:
    """The agent reported a non-retryable failure: the task is Failed, not retried."""
    stamp = rfc3339(now)
    error = report.error
    reason = error.reason if error else "Failed"
    return Transition(
        patch={
            "phase": "Failed",
            "error": {
                "reason": reason,
                "message": error.message if error else "",
                "retryable": False,
            },
            "finishedAt": stamp,
            "lastTransitionTime": stamp,
            "history": _history(status, _entry(status, outcome="Failed", reason=reason, now=stamp)),
        },
        reason="Failed",
        message=f"worker {report.worker} reported a non-retryable failure: {reason}",
        warning=True,
    )


def hold(status: dict[str, Any], *, reason: str, now: datetime.datetime) -> Transition:
    stamp = rfc3339(now)
    return Transition(
        patch={
            "phase": "Held",
            "lastTransitionTime": stamp,
            "history": _history(status, _entry(status, outcome="Held", reason=reason, now=stamp)),
            "conditions": _conditions(
                status, _condition("Held", True, reason, "waiting for a person to requeue", stamp)
            ),
        },
        reason="Held",
        message=(
            f"lease of attempt {status.get('attempt')} on {status.get('worker')} expired; "
            "held for a person (agentq requeue)"
        ),
        warning=True,
        extra_events=(("LeaseExpired", f"lease held by {status.get('worker')} expired"),),
    )


def grace(
    status: dict[str, Any], *, until: datetime.datetime, now: datetime.datetime
) -> Transition:
    return Transition(
        patch={"graceUntil": rfc3339(until), "lastTransitionTime": rfc3339(now)},
        reason="LeaseExpired",
        message=(
            f"lease held by {status.get('worker')} expired; accepting a late report "
            f"until {rfc3339(until)}"
        ),
        warning=True,
    )


def requeue(status: dict[str, Any], *, now: datetime.datetime, request: str) -> Transition:
    """A person redrives a Held, DeadLettered or Failed task: back to Pending, fresh budget."""
    stamp = rfc3339(now)
    return Transition(
        patch={
            "phase": "Pending",
            "worker": None,
            "reclaims": 0,
            "notBefore": None,
            "graceUntil": None,
            "finishedAt": None,
            "lastTransitionTime": stamp,
            "requeueHandled": request,
            "history": _history(
                status, _entry(status, outcome="Requeued", reason="Requeued", now=stamp)
            ),
            "conditions": [
                c
                for c in status.get("conditions") or []
                if c.get("type") not in ("DeadLettered", "Held")
            ],
        },
        reason="Requeued",
        message=f"requeued from {status.get('phase')} (request {request})",
    )
