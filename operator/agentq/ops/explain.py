"""Why a task is where it is: ``agentq explain``'s reasoning, as a pure function.

``explain(task, workers=..., events=..., lease=..., now=...)`` reads the task,
the AgentWorkers of its namespace, the Events recorded on it and its claim's
Lease (all plain dicts, as the API server returns them) and returns an
``Explanation``: findings (each a machine-readable ``code``, a sentence and,
where there is one, the command that acts on it), the attempt timeline and
the events. No I/O and no clock of its own (``now`` is given), so every case
is a unit test.

Finding codes (stable; ``-o json`` shows them):

========================  ===========================================================
``NotSeenYet``            no status: the operator has not picked the task up
``BackoffWait``           Pending, waiting out its retry backoff until ``notBefore``
``Unschedulable``         no AgentWorker offers the required capabilities (named)
``NoReadyWorker``         capable workers exist, none Ready and unpaused (each says why)
``NoFreeCapacity``        capable Ready workers exist, all at ``maxInFlight``
``DispatchDue``           a capable Ready worker has a free slot: the next pass assigns it
``AwaitingStart``         Assigned; its agent has not renewed the claim yet
``WorkerNotReady``        the worker holding the claim is not Ready (it may expire)
``Running``               Running; last renewal and progress
``GracePeriod``           the lease expired; a late report is accepted until ``graceUntil``
``Held``                  the lease expired under ``onLeaseExpiry: Hold``; a person decides
``DeadLettered``          too many failed attempts; the reasons, tallied
``Failed``                the agent reported a non-retryable failure
``Succeeded``             done
``RequeueRequested``      ``agentq requeue`` asked; the operator has not honoured it yet
``ReportsRefused``        reports from stale holders (zombies) were refused
``InQueue``               Pending in its AgentQueue: its position there, by priority then age
``QueueAtCap``            its AgentQueue (or an ancestor) holds its ``maxInFlight`` claims
``QueueOverShare``        its AgentQueue (or an ancestor) was granted more than its weight share
``QueueNotFound``         ``Queued: False``: the AgentQueue it names does not exist
``QueueForbidden``        ``Queued: False``: the queue's namespaceSelector leaves its namespace out
``QueueNotLeaf``          ``Queued: False``: the queue has child queues; only leaves hold tasks
``QueueNotAttached``      ``Queued: False``: the queue's parent is missing, or its parents cycle
``NoWorkerNamespace``     ``Queued: False``: the queue names no workerNamespace
``NamespaceNotWatched``   ``Queued: False``: the operator does not watch the workerNamespace
``TaskNameTooLong``       ``Queued: False``: its claim's Lease name across namespaces would not fit
``CrossNamespace...``     ``Queued: False``: (an older operator) workers in another namespace
``NotQueued``             ``Queued: False`` for a reason this CLI does not know
``BudgetNotFound``        ``Budgeted: False``: an AgentBudget it names does not exist
``EstimateExceedsLimit``  ``Budgeted: False``: its estimate exceeds a budget's per-minute limit
``BudgetWait``            ``Budgeted: False``: a budget has no room now (requests, tokens,
                          concurrency or a provider's throttle; the reason says which)
========================  ===========================================================

A task that names an AgentQueue (``spec.queue``) and is not admitted by it is
judged by its ``Queued`` condition only (the operator places it in no pending
queue, so neither are workers looked at); one that is admitted gets its place
in the queue, the queue's cap and share (from the AgentQueues' status), then
the same placement as any task.
"""

from __future__ import annotations

import datetime
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from agentq import lifecycle, protocol
from agentq.clock import parse_time, rfc3339
from agentq.models import (
    REQUEUABLE_PHASES,
    AgentQueue,
    AgentTask,
    AgentWorker,
    AttemptOutcome,
    ConditionStatus,
    ModelError,
    TaskPhase,
    parse_queue,
    parse_task,
    parse_worker,
)

Body = Mapping[str, Any]
REQUEUABLE = REQUEUABLE_PHASES
# lifecycle.grant's event message: "attempt 2 assigned to worker a with fencing token 7".
_EPOCH = datetime.datetime.min.replace(tzinfo=datetime.UTC)
_GRANT_MESSAGE = re.compile(r"attempt (\d+) assigned to worker (\S+) with fencing token (\d+)")


@dataclass(frozen=True)
class Finding:
    """One reason the task is where it is."""

    code: str
    message: str
    hint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "hint": self.hint}


@dataclass(frozen=True)
class Attempt:
    """One row of the timeline: an attempt (ended or current), or a requeue."""

    attempt: int | None
    worker: str | None
    token: int | None
    outcome: str
    reason: str | None
    started: datetime.datetime | None
    ended: datetime.datetime | None

    def duration(self, now: datetime.datetime) -> float | None:
        """Seconds from grant to end (to ``now`` while it runs); None if unknown."""
        if self.started is None:
            return None
        end = self.ended or now
        return max(0.0, (end - self.started).total_seconds())

    def to_dict(self, now: datetime.datetime) -> dict[str, Any]:
        return {
            "attempt": self.attempt,
            "worker": self.worker,
            "token": self.token,
            "outcome": self.outcome,
            "reason": self.reason,
            "started": _stamp(self.started),
            "ended": _stamp(self.ended),
            "durationSeconds": _round(self.duration(now)),
        }


@dataclass(frozen=True)
class EventLine:
    time: datetime.datetime | None
    type: str
    reason: str
    message: str
    count: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "time": _stamp(self.time),
            "type": self.type,
            "reason": self.reason,
            "message": self.message,
            "count": self.count,
        }


@dataclass(frozen=True)
class QueuePlace:
    """A queued task's place among the admitted Pending tasks of its AgentQueue that the
    CLI listed: ``position`` 1 is next (by priority, then age), of ``pending``."""

    position: int
    pending: int


@dataclass(frozen=True)
class Explanation:
    namespace: str
    name: str
    phase: str
    worker: str | None
    attempt: int
    reclaims: int
    max_reclaims: int | None  # None: the operator's default (MAX_RECLAIMS)
    fencing_token: int | None
    required: tuple[str, ...]
    cost: float
    findings: tuple[Finding, ...]
    timeline: tuple[Attempt, ...]
    events: tuple[EventLine, ...]
    now: datetime.datetime
    history_truncated: bool = False
    queue: str | None = None  # spec.queue
    queue_place: QueuePlace | None = None  # where it stands there (admitted, Pending)

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def to_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "phase": self.phase,
            "worker": self.worker,
            "attempt": self.attempt,
            "reclaims": self.reclaims,
            "maxReclaims": self.max_reclaims,
            "fencingToken": self.fencing_token,
            "requiredCapabilities": list(self.required),
            "cost": self.cost,
            "queue": self.queue,
            "queuePosition": self.queue_place.position if self.queue_place else None,
            "queuePending": self.queue_place.pending if self.queue_place else None,
            "findings": [f.to_dict() for f in self.findings],
            "timeline": [a.to_dict(self.now) for a in self.timeline],
            "historyTruncated": self.history_truncated,
            "events": [e.to_dict() for e in self.events],
        }


def _stamp(moment: datetime.datetime | None) -> str | None:
    return rfc3339(moment) if moment else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def human_seconds(seconds: float) -> str:
    """``75.2 -> "1m15s"``: durations as ``kubectl`` prints ages."""
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def _names(items: Iterable[str]) -> str:
    return ", ".join(sorted(items))


# --- workers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerView:
    """What placement needs to know about one AgentWorker."""

    name: str
    capabilities: frozenset[str]
    paused: bool
    phase: str | None
    ready_message: str | None
    in_flight: int
    max_in_flight: int

    @classmethod
    def of(cls, worker: AgentWorker) -> WorkerView:
        ready = next((c for c in worker.status.conditions or [] if c.type == "Ready"), None)
        return cls(
            name=worker.name,
            capabilities=worker.spec.capabilities,
            paused=worker.spec.paused,
            phase=worker.status.phase.value if worker.status.phase else None,
            ready_message=ready.message if ready is not None else None,
            in_flight=worker.status.in_flight or 0,
            max_in_flight=worker.spec.max_in_flight,
        )

    @property
    def available(self) -> bool:
        return self.phase == "Ready" and not self.paused

    def why_not_available(self, namespace: str) -> str:
        if self.paused:
            return f"paused (drained; `agentq uncordon {self.name} -n {namespace}` resumes it)"
        if self.phase is None:
            return "not seen by the operator yet (no status)"
        lease = protocol.worker_lease_name(self.name)
        detail = f": {self.ready_message}" if self.ready_message else ""
        return f"{self.phase}{detail} (is the agent's sidecar renewing Lease {lease}?)"


def parse_workers(bodies: Iterable[Body]) -> list[WorkerView]:
    """The AgentWorkers that parse (one that does not is skipped: it cannot take tasks)."""
    out = []
    for body in bodies:
        try:
            out.append(WorkerView.of(parse_worker(body)))
        except ModelError:
            continue
    return sorted(out, key=lambda w: w.name)


def placement(
    required: frozenset[str],
    workers: list[WorkerView],
    *,
    namespace: str,
    pending_ahead: int | None = None,
) -> Finding:
    """Where a Pending task can go, from the capable workers' readiness and free slots."""
    wanted = _names(required) or "(no capabilities)"
    if not workers:
        return Finding(
            "Unschedulable",
            f"there are no AgentWorkers in namespace {namespace}, so nothing can take it",
            "create an AgentWorker with the capabilities it needs (docs/quickstart.md), "
            "or look in another namespace (-n)",
        )
    capable = [w for w in workers if required <= w.capabilities]
    if not capable:
        offered = frozenset().union(*(w.capabilities for w in workers))
        missing = required - offered
        if missing:
            message = (
                f"unschedulable: no AgentWorker in namespace {namespace} offers "
                f"{_names(missing)} (it requires {wanted})"
            )
        else:
            closest = sorted(workers, key=lambda w: (len(required - w.capabilities), w.name))[:3]
            gaps = "; ".join(f"{w.name} lacks {_names(required - w.capabilities)}" for w in closest)
            message = (
                f"unschedulable: each of {wanted} is offered by some worker, but no single "
                f"worker offers them all ({gaps})"
            )
        return Finding(
            "Unschedulable",
            message,
            "add the missing capabilities to a worker's spec.capabilities, or start a worker "
            "that has them",
        )
    available = [w for w in capable if w.available]
    if not available:
        shown = "; ".join(f"{w.name}: {w.why_not_available(namespace)}" for w in capable[:5])
        more = f"; and {len(capable) - 5} more" if len(capable) > 5 else ""
        return Finding(
            "NoReadyWorker",
            f"{len(capable)} worker(s) could take it but none is Ready and unpaused: {shown}{more}",
            f"start the agents of these workers, or `agentq uncordon WORKER -n {namespace}`",
        )
    ahead = (
        f"; {pending_ahead} Pending task(s) ahead of it (by priority, then age) can go to the "
        "same workers"
        if pending_ahead
        else ""
    )
    free = [w for w in available if w.in_flight < w.max_in_flight]
    slots = ", ".join(f"{w.name} {w.in_flight}/{w.max_in_flight}" for w in available[:8])
    if not free:
        return Finding(
            "NoFreeCapacity",
            f"every capable Ready worker is full ({slots}); it is assigned when one of "
            f"their tasks ends{ahead}",
            f"`agentq top -n {namespace}` shows the workers; raise maxInFlight or add workers",
        )
    return Finding(
        "DispatchDue",
        f"a capable Ready worker has a free slot ({slots}): the operator assigns it at its "
        f"next pass{ahead}",
        "if it stays Pending, check that the operator runs and leads (its logs; metric "
        "agentq_leader)",
    )


# --- the AgentQueue -----------------------------------------------------------------------

# The operator's verdicts on spec.queue (agentq.operator.tenants; docs/tenancy.md), each
# with what the task's owner can do about it. Team members cannot write AgentQueues
# (cluster-scoped, owned by cluster admins), so most say whom to ask.
_VERDICT_HINTS = {
    "QueueNotFound": (
        "ask a cluster admin to create AgentQueue {queue} (docs/tenancy.md), or delete the "
        "task and submit it again naming an existing queue (spec.queue is immutable); "
        "`kubectl get agentqueues` lists them"
    ),
    "QueueForbidden": (
        "ask a cluster admin to label namespace {namespace} so that AgentQueue {queue}'s "
        "namespaceSelector selects it (`kubectl get agentqueue {queue} -o yaml` shows the "
        "selector), or submit it again naming a queue open to {namespace}"
    ),
    "QueueNotLeaf": (
        "only leaf queues hold tasks: submit it again naming one of {queue}'s child queues "
        "(spec.queue is immutable)"
    ),
    "QueueNotAttached": (
        "ask a cluster admin to create the missing parent queue or break the cycle "
        "(`kubectl get agentqueue {queue} -o yaml`: its Attached condition names it)"
    ),
    "NoWorkerNamespace": ("ask a cluster admin to set spec.workerNamespace of AgentQueue {queue}"),
    "NamespaceNotWatched": (
        "the operator watches only some namespaces (--namespace): ask its admin to add "
        "AgentQueue {queue}'s workerNamespace"
    ),
    "TaskNameTooLong": (
        "submit it again with a name of at most 63 characters (the AgentTask CRD's rule), "
        "so its claim's Lease in the queue's workerNamespace can be named after it"
    ),
    "CrossNamespaceNotSupported": (
        "claims across namespaces are not built yet: submit it in the queue's "
        "workerNamespace, or name a queue whose workerNamespace is {namespace}"
    ),
}


def _not_queued(task: AgentTask, queue: str) -> Finding | None:
    """The ``Queued: False`` verdict, if the operator wrote one, as a finding."""
    found = next((c for c in task.status.conditions or [] if c.type == lifecycle.QUEUED), None)
    if found is None or found.status is not ConditionStatus.FALSE:
        return None
    ns = task.namespace or "default"
    hint = _VERDICT_HINTS.get(found.reason)
    unknown = f" ({found.reason})" if hint is None else ""
    return Finding(
        found.reason if hint is not None else "NotQueued",
        f"never dispatched while AgentQueue {queue} does not admit it{unknown}: {found.message}",
        (hint or "`kubectl get agentqueue {queue} -o yaml` shows the queue").format(
            queue=queue, namespace=ns
        ),
    )


# --- the AgentBudgets ----------------------------------------------------------------------

_BUDGET_VERDICT_HINTS = {
    "BudgetNotFound": (
        "ask a cluster admin to create the AgentBudget (docs/budgets.md), or submit it again "
        "naming an existing one (spec.budgets is immutable); `kubectl get agentbudgets` "
        "lists them"
    ),
    "EstimateExceedsLimit": (
        "lower its estimate (submit it again: spec.budgets is immutable), or ask a cluster "
        "admin to raise the budget's limit"
    ),
}


def _budget_name(body: Body) -> str:
    return str((body.get("metadata") or {}).get("name") or "")


def _budget_use(name: str, body: Body) -> str:
    """What an AgentBudget's status says of its room (as the operator last wrote it)."""
    spec, status = body.get("spec") or {}, body.get("status") or {}
    parts = []
    if spec.get("maxConcurrent") is not None:
        parts.append(f"{status.get('inUse', '?')}/{spec['maxConcurrent']} claims")
    for field, what in (("requestsPerMinute", "Requests"), ("tokensPerMinute", "Tokens")):
        if spec.get(field) is not None:
            used = status.get(f"used{what}", "?")
            reserved = status.get(f"reserved{what}", "?")
            parts.append(
                f"{what.lower()} {used} used + {reserved} reserved of {spec[field]} a minute"
            )
    if status.get("throttledUntil"):
        parts.append(f"throttled until {status['throttledUntil']}")
    return f"AgentBudget {name}: " + (", ".join(parts) or "no limits")


def _not_budgeted(task: AgentTask, budgets: Mapping[str, Body]) -> Finding | None:
    """The ``Budgeted: False`` condition, if the operator wrote one, as a finding (with
    the status of the budgets it names, for a wait)."""
    found = next((c for c in task.status.conditions or [] if c.type == lifecycle.BUDGETED), None)
    if found is None or found.status is not ConditionStatus.FALSE:
        return None
    hint = _BUDGET_VERDICT_HINTS.get(found.reason)
    if hint is not None:
        return Finding(found.reason, f"never dispatched as it is: {found.message}", hint)
    named = [b.name for b in task.spec.budgets or ()]
    use = "; ".join(_budget_use(n, budgets[n]) for n in named if n in budgets)
    return Finding(
        "BudgetWait",
        f"{found.message} ({found.reason}); it is granted when the budget has room again"
        + (f" ({use})" if use else ""),
        "`kubectl get agentbudgets` shows each budget's use and limits",
    )


def parse_queues(bodies: Iterable[Body]) -> dict[str, AgentQueue]:
    """The AgentQueues that parse, by name (one that does not holds no tasks)."""
    out = {}
    for body in bodies:
        try:
            parsed = parse_queue(body)
        except ModelError:
            continue
        out[parsed.name] = parsed
    return out


def _path(queue: str, queues: Mapping[str, AgentQueue]) -> list[AgentQueue]:
    """``queue`` and its ancestors that exist, leaf first (a cycle is cut)."""
    path: list[AgentQueue] = []
    name: str | None = queue
    while name is not None and name in queues and all(q.name != name for q in path):
        path.append(queues[name])
        name = queues[name].spec.parent
    return path


def _capped(path: list[AgentQueue]) -> AgentQueue | None:
    """The first queue of ``path`` whose status shows it at its ``maxInFlight``."""
    for queue in path:
        cap = queue.spec.max_in_flight
        if cap is not None and (queue.status.in_flight or 0) >= cap:
            return queue
    return None


def _pct(value: float) -> str:
    return f"{100 * value:.0f}%"


def queue_findings(
    task: AgentTask, place: QueuePlace | None, queues: Mapping[str, AgentQueue] | None
) -> tuple[list[Finding], bool]:
    """An admitted task's place in its queue, and the queue's cap and share; and whether
    a queue on its path is at its cap (then no free worker slot dispatches it)."""
    name = task.spec.queue or ""
    where = (
        f"position {place.position} of {place.pending} admitted Pending task(s) of the queue "
        "in this namespace (by priority, then age)"
        if place is not None
        else "its position is unknown"
    )
    if queues is None:
        where += (
            f"; AgentQueue {name} could not be read (forbidden?), so its cap and share are "
            "not shown"
        )
    found = [
        Finding(
            "InQueue",
            f"queued in AgentQueue {name}: {where}. The queue takes its turn by the weights "
            "of its tree; within it the highest priority, then the oldest, goes first",
        )
    ]
    if queues is None:
        return found, False
    path = _path(name, queues)
    capped = _capped(path)
    if capped is not None:
        whose = "" if capped.name == name else f" (an ancestor of {name}: its subtree's)"
        found.append(
            Finding(
                "QueueAtCap",
                f"AgentQueue {capped.name}{whose} holds {capped.status.in_flight} claim(s), "
                f"its maxInFlight {capped.spec.max_in_flight}: its tasks wait, keeping their "
                "place, until one of them ends",
                f"ask a cluster admin to raise AgentQueue {capped.name}'s maxInFlight; "
                "`agentq top` shows the queues",
            )
        )
    for queue in path:
        share, weight_share = queue.status.share, queue.status.weight_share
        if share is None or weight_share is None or share <= weight_share:
            continue
        whose = "" if queue.name == name else f" (an ancestor of {name})"
        found.append(
            Finding(
                "QueueOverShare",
                f"AgentQueue {queue.name}{whose} was granted {_pct(share)} of the cost granted "
                f"to it and its sibling queues since the operator's leader started, over its "
                f"weight share {_pct(weight_share)}: while siblings have tasks waiting, they "
                "go first until the shares meet",
                "`agentq top` shows each queue's share against its weight share",
            )
        )
        break
    return found, capped is not None


# --- the timeline -----------------------------------------------------------------------


def event_lines(events: Iterable[Body]) -> list[EventLine]:
    """Events (core/v1 dicts) in time order.

    Their timestamps have one-second resolution; within a second they are ordered by
    resourceVersion, the order the API server stored them (good enough for display).
    """
    keyed = []
    for event in events:
        meta = event.get("metadata") or {}
        when = parse_time(
            event.get("lastTimestamp")
            or event.get("eventTime")
            or event.get("firstTimestamp")
            or meta.get("creationTimestamp")
        )
        version = str(meta.get("resourceVersion") or "")
        line = EventLine(
            time=when,
            type=str(event.get("type") or "Normal"),
            reason=str(event.get("reason") or ""),
            message=str(event.get("message") or ""),
            count=int(event.get("count") or 1),
        )
        keyed.append((when or _EPOCH, int(version) if version.isdigit() else 0, line))
    return [line for _, _, line in sorted(keyed, key=lambda k: (k[0], k[1]))]


def _grants(events: list[EventLine]) -> dict[int, datetime.datetime]:
    """Fencing token -> when its grant's Assigned event was recorded."""
    out: dict[int, datetime.datetime] = {}
    for event in events:
        if event.reason != "Assigned" or event.time is None:
            continue
        found = _GRANT_MESSAGE.search(event.message)
        if found:
            out.setdefault(int(found.group(3)), event.time)
    return out


def timeline(task: AgentTask, events: list[EventLine]) -> tuple[list[Attempt], bool]:
    """The attempts (and requeues) in order, and whether older history was dropped."""
    status = task.status
    grants = _grants(events)
    rows: list[Attempt] = []
    for entry in status.history or []:
        started = None
        if entry.outcome is not AttemptOutcome.REQUEUED and entry.token is not None:
            started = grants.get(entry.token)
        rows.append(
            Attempt(
                attempt=entry.attempt,
                worker=entry.worker,
                token=entry.token,
                outcome=entry.outcome.value,
                reason=entry.reason,
                started=started,
                ended=entry.time,
            )
        )
    if status.phase in (TaskPhase.ASSIGNED, TaskPhase.RUNNING):
        started = status.assigned_at
        if started is None and status.fencing_token is not None:
            started = grants.get(status.fencing_token)
        rows.append(
            Attempt(
                attempt=status.attempt,
                worker=status.worker,
                token=status.fencing_token,
                outcome=status.phase.value,
                reason=None,
                started=started,
                ended=None,
            )
        )
    first = next((r.attempt for r in rows if r.attempt is not None), None)
    truncated = first is not None and first > 1
    return rows, truncated


# --- findings per phase -------------------------------------------------------------------


def _failure_tally(task: AgentTask) -> str:
    """``"LeaseExpired x2, AgentError x1"``: the failed attempts since the last requeue."""
    tally: Counter[str] = Counter()
    for entry in task.status.history or []:
        if entry.outcome is AttemptOutcome.REQUEUED:
            tally.clear()
        elif entry.outcome is AttemptOutcome.FAILED:
            tally[entry.reason or "Unknown"] += 1
    return ", ".join(f"{reason} x{count}" for reason, count in tally.most_common())


def _error_text(task: AgentTask) -> str:
    error = task.status.error
    if error is None:
        return ""
    text = error.reason or "Unknown"
    if error.message:
        text += f": {error.message[:300]}"
    return text


def _lease_facts(lease: Body | None, now: datetime.datetime) -> str:
    if not lease:
        return "its Lease is not there (the operator re-writes a missing grant's Lease)"
    spec = lease.get("spec") or {}
    renewed = parse_time(spec.get("renewTime"))
    parts = []
    if renewed is not None:
        # renewTime is the holder's clock; the operator judges expiry on its own.
        parts.append(f"last renewed {human_seconds((now - renewed).total_seconds())} ago")
    annotations = (lease.get("metadata") or {}).get("annotations") or {}
    if protocol.ANNOTATION_REPORT in annotations:
        parts.append("a report is on the Lease, waiting for the operator")
    return ", ".join(parts)


def _phase_findings(
    task: AgentTask,
    workers: list[WorkerView],
    lease: Body | None,
    now: datetime.datetime,
    pending_ahead: int | None,
    *,
    written: bool,
    queue_place: QueuePlace | None = None,
    queues: Mapping[str, AgentQueue] | None = None,
    budgets: Mapping[str, Body] | None = None,
    holders_known: bool = True,
) -> list[Finding]:
    status, spec = task.status, task.spec
    ns = task.namespace or "default"
    # The holder is a worker of the claim's namespace: the task's own, or -- a claim
    # across namespaces -- status.workerNamespace (``workers`` are that namespace's).
    holder_ns = status.worker_namespace or ns
    name = task.name
    requeue_hint = f"fix the cause, then `agentq requeue {name} -n {ns}`"
    phase = status.phase
    if phase is None or phase is TaskPhase.PENDING:
        found = []
        if not written:
            found.append(
                Finding(
                    "NotSeenYet",
                    "the task has no status: the operator has not picked it up",
                    f"check that an operator runs, leads and watches namespace {ns} "
                    "(its logs; metric agentq_leader)",
                )
            )
        if status.not_before is not None and status.not_before > now:
            wait = human_seconds((status.not_before - now).total_seconds())
            found.append(
                Finding(
                    "BackoffWait",
                    f"waiting out its retry backoff until {_stamp(status.not_before)} "
                    f"({wait} from now) after failed attempt {status.reclaims or 0}"
                    + (f" ({_error_text(task)})" if status.error else ""),
                )
            )
        capped = False
        if spec.queue is not None:
            refused = _not_queued(task, spec.queue)
            if refused is not None:
                # The operator judges nothing else while the queue does not admit it.
                return [*found, refused]
            more, capped = queue_findings(task, queue_place, queues)
            found += more
        budgeted = _not_budgeted(task, budgets or {})
        if budgeted is not None:
            found.append(budgeted)
            if budgeted.code != "BudgetWait":
                return found  # never dispatched as it is: no worker is looked at
        placed = placement(
            spec.required_capabilities, workers, namespace=ns, pending_ahead=pending_ahead
        )
        if not (capped and placed.code == "DispatchDue"):  # a free slot does not lift a cap
            found.append(placed)
        return found
    worker = status.worker or "?"
    token = status.fencing_token
    if phase is TaskPhase.ASSIGNED:
        found = [
            Finding(
                "AwaitingStart",
                f"assigned to {worker} (attempt {status.attempt}, fencing token {token}) "
                f"{_ago(status.assigned_at, now)}; waiting for its agent to renew the claim "
                f"for the first time. If the agent never does, the claim expires after "
                f"{spec.lease_duration_seconds}s and onLeaseExpiry={spec.on_lease_expiry.value} "
                "applies",
            )
        ]
        return found + (_holder_health(worker, workers, holder_ns) if holders_known else [])
    if phase is TaskPhase.RUNNING:
        progress = f'; last progress "{status.progress}"' if status.progress else ""
        deadline = (
            f"; reclaimed if progress stalls for {spec.progress_deadline_seconds}s"
            if spec.progress_deadline_seconds
            else ""
        )
        found = [
            Finding(
                "Running",
                f"running on {worker} since {_stamp(status.started_at or status.assigned_at)} "
                f"(attempt {status.attempt}, fencing token {token}); "
                f"{_lease_facts(lease, now)}{progress}. The operator reclaims it if the lease "
                f"is not renewed for {spec.lease_duration_seconds}s{deadline}",
            )
        ]
        if status.grace_until is not None:
            found.append(
                Finding(
                    "GracePeriod",
                    f"the lease of {worker} expired; a late report from it is accepted until "
                    f"{_stamp(status.grace_until)}, then the task is redispatched",
                )
            )
        return found + (_holder_health(worker, workers, holder_ns) if holders_known else [])
    if phase is TaskPhase.HELD:
        return [
            Finding(
                "Held",
                f"held {_ago(status.last_transition_time, now)}: the lease of attempt "
                f"{status.attempt} on {worker} expired and onLeaseExpiry is Hold, so a person "
                f"decides; its Lease is kept for inspection ({_lease_facts(lease, now)})",
                f"look at {worker}'s agent, then `agentq requeue {name} -n {ns}`",
            )
        ]
    if phase is TaskPhase.DEAD_LETTERED:
        limit = spec.max_reclaims
        budget = f"maxReclaims={limit}" if limit is not None else "the operator's MAX_RECLAIMS"
        tally = _failure_tally(task)
        return [
            Finding(
                "DeadLettered",
                f"dead-lettered {_ago(status.finished_at or status.last_transition_time, now)} "
                f"after {status.reclaims} failed attempts, more than {budget} allows"
                + (f" ({tally})" if tally else "")
                + (f"; last error {_error_text(task)}" if status.error else ""),
                requeue_hint,
            )
        ]
    if phase is TaskPhase.FAILED:
        return [
            Finding(
                "Failed",
                f"{worker} reported a non-retryable failure "
                f"{_ago(status.finished_at, now)}: {_error_text(task) or 'no reason given'}",
                requeue_hint,
            )
        ]
    result = (
        f"; result in {status.result_ref}"
        if status.result_ref
        else ("; result in status.result" if status.result is not None else "")
    )
    return [
        Finding(
            "Succeeded",
            f"succeeded on {worker} {_ago(status.finished_at, now)} in attempt "
            f"{status.attempt} (fencing token {token}){result}",
        )
    ]


def _ago(moment: datetime.datetime | None, now: datetime.datetime) -> str:
    if moment is None:
        return ""
    return f"at {_stamp(moment)} ({human_seconds((now - moment).total_seconds())} ago)"


def _holder_health(worker: str, workers: list[WorkerView], namespace: str) -> list[Finding]:
    holder = next((w for w in workers if w.name == worker), None)
    if holder is None:
        return [
            Finding(
                "WorkerNotReady",
                f"its worker {worker} no longer exists; the claim will expire and be reclaimed",
            )
        ]
    if holder.phase == "NotReady":
        return [
            Finding(
                "WorkerNotReady",
                f"its worker is {holder.why_not_available(namespace)}; unless the agent comes "
                "back, the claim expires and is reclaimed",
            )
        ]
    return []


_REFUSED = re.compile(r"report from (\S+) with token (\d+)")
# History reasons that mean "the operator ended the attempt", not "the holder reported".
_NOT_REPORTED = frozenset({"LeaseExpired", "ProgressDeadlineExceeded"})


def _committed_reports(task: AgentTask) -> set[tuple[str, int]]:
    """(worker, token) of the attempts whose own report was committed."""
    out = set()
    for entry in task.status.history or []:
        if entry.worker is None or entry.token is None:
            continue
        if entry.outcome is AttemptOutcome.SUCCEEDED or (
            entry.outcome is AttemptOutcome.FAILED and entry.reason not in _NOT_REPORTED
        ):
            out.add((entry.worker, entry.token))
    return out


def _refusals(task: AgentTask, events: list[EventLine]) -> Finding | None:
    # A refusal of the very report that was committed (the operator read the Lease
    # again before it was deleted) is an echo, not a zombie: leave it out.
    committed = _committed_reports(task)
    refused = []
    for event in events:
        if event.reason != "StaleReportRefused":
            continue
        found = _REFUSED.search(event.message)
        if found and (found.group(1), int(found.group(2))) in committed:
            continue
        refused.append(event)
    total = sum(e.count for e in refused)
    if not total:
        return None
    shown = "; ".join(e.message for e in refused[-3:])
    return Finding(
        "ReportsRefused",
        f"{total} report(s) from a holder that no longer owned the claim (a zombie) were "
        "refused, so they changed nothing" + (f": {shown}" if shown else ""),
        "the refused agent lost its lease (frozen, partitioned or too slow to renew); "
        "check it, and make its sink fenced (docs/concepts.md#fencing-at-the-sink)",
    )


def _requeue_pending(task: AgentTask) -> Finding | None:
    request = task.metadata.annotations.get(protocol.ANNOTATION_REQUEUE)
    if not request or protocol.requeue_id(request) == task.status.requeue_handled:
        return None
    if task.status.phase not in REQUEUABLE:
        return None
    return Finding(
        "RequeueRequested",
        f"a requeue was requested ({request}) and the operator has not honoured it yet",
        "check that the operator runs and leads (its logs; metric agentq_leader)",
    )


def explain(
    task: Body,
    *,
    workers: Iterable[Body],
    events: Iterable[Body],
    lease: Body | None,
    now: datetime.datetime,
    pending_ahead: int | None = None,
    queue_place: QueuePlace | None = None,
    queues: Iterable[Body] | None = None,
    budgets: Iterable[Body] | None = None,
    holders_known: bool = True,
) -> Explanation:
    """Why ``task`` is where it is. Raises ``ModelError`` if it is not an AgentTask.

    For a task with ``spec.queue``: ``queue_place`` is its place in the queue
    (``queue_place()`` over a listing), ``queues`` the AgentQueues (None: they could
    not be read). For a task with ``spec.budgets``: ``budgets`` the AgentBudgets, whose
    status a wait for room shows. A task holding a claim across namespaces
    (``status.workerNamespace``): ``workers`` are that namespace's (``holders_known``
    False: they could not be read, nothing is said of the holder's health)."""
    parsed = parse_task(task)
    lines = event_lines(events)
    views = parse_workers(workers)
    requested = _requeue_pending(parsed)
    findings = [requested] if requested is not None else []
    # No phase in the object itself (a CRD that defaults it to Pending gives one at once):
    # no operator has written to the task.
    written = bool((task.get("status") or {}).get("phase"))
    findings += _phase_findings(
        parsed,
        views,
        lease,
        now,
        pending_ahead,
        written=written,
        queue_place=queue_place,
        queues=parse_queues(queues) if queues is not None else None,
        budgets={_budget_name(b): b for b in budgets or ()},
        holders_known=holders_known,
    )
    refused = _refusals(parsed, lines)
    if refused is not None:
        findings.append(refused)
    rows, truncated = timeline(parsed, lines)
    status = parsed.status
    return Explanation(
        namespace=parsed.namespace or "default",
        name=parsed.name,
        phase=status.phase.value if status.phase and written else "(none)",
        worker=status.worker,
        attempt=status.attempt or 0,
        reclaims=status.reclaims or 0,
        max_reclaims=parsed.spec.max_reclaims,
        fencing_token=status.fencing_token,
        required=tuple(sorted(parsed.spec.required_capabilities)),
        cost=parsed.spec.cost,
        findings=tuple(findings),
        timeline=tuple(rows),
        events=tuple(lines),
        now=now,
        history_truncated=truncated,
        queue=parsed.spec.queue,
        queue_place=queue_place if status.phase in (None, TaskPhase.PENDING) else None,
    )


def _admitted(task: AgentTask) -> bool:
    """Whether the operator holds ``task`` in a pending queue: no ``Queued: False``."""
    return not any(
        c.type == lifecycle.QUEUED and c.status is ConditionStatus.FALSE
        for c in task.status.conditions or []
    )


def _ahead(task: AgentTask, tasks: Iterable[Body]) -> Iterator[AgentTask]:
    """The admitted Pending tasks of ``task``'s pending queue (its namespace's own, or its
    AgentQueue's) that go before it: higher ``spec.priority``, or as high and older."""
    created = task.metadata.creation_timestamp
    if created is None:
        return
    place = (-task.spec.priority, created, task.name)
    for other in tasks:
        try:
            candidate = parse_task(other)
        except ModelError:
            continue
        if candidate.name == task.name or candidate.status.phase not in (None, TaskPhase.PENDING):
            continue
        if candidate.spec.queue != task.spec.queue or not _admitted(candidate):
            continue
        other_created = candidate.metadata.creation_timestamp
        # The operator plans by priority, then oldest first, ties by name.
        if (
            other_created is None
            or (
                -candidate.spec.priority,
                other_created,
                candidate.name,
            )
            >= place
        ):
            continue
        yield candidate


def queue_place(task: Body, tasks: Iterable[Body]) -> QueuePlace | None:
    """Where ``task`` stands among the admitted Pending tasks of its AgentQueue in
    ``tasks`` (a listing of its namespace: a queue admits only tasks of its
    workerNamespace today); None if it names no queue or has no creation time."""
    parsed = parse_task(task)
    if parsed.spec.queue is None or parsed.metadata.creation_timestamp is None:
        return None
    tasks = list(tasks)
    ahead = sum(1 for _ in _ahead(parsed, tasks))
    others = 0
    for other in tasks:
        try:
            candidate = parse_task(other)
        except ModelError:
            continue
        if (
            candidate.name != parsed.name
            and candidate.spec.queue == parsed.spec.queue
            and candidate.status.phase in (None, TaskPhase.PENDING)
            and _admitted(candidate)
        ):
            others += 1
    return QueuePlace(position=ahead + 1, pending=others + 1)


def pending_ahead(task: Body, tasks: Iterable[Body], workers: list[WorkerView]) -> int:
    """Pending tasks ahead of ``task`` in its pending queue (higher ``spec.priority``, or
    as high and older) that one of its capable workers could take. Tasks of another
    queue (an AgentQueue, or none) are not ahead of it: they take turns by weight."""
    parsed = parse_task(task)
    capable = [w for w in workers if parsed.spec.required_capabilities <= w.capabilities]
    count = 0
    for candidate in _ahead(parsed, tasks):
        needs = candidate.spec.required_capabilities
        if any(needs <= w.capabilities for w in capable):
            count += 1
    return count
