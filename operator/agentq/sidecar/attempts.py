"""The sidecar's pure core: the attempts its worker holds, and when to renew each.

An attempt is one grant of a task to this worker: a task Lease
(``agentq-task-<task>``) whose holder is the worker, with a fencing token. This
module turns what the watch says about those Leases into attempts, records the
agent's heartbeats, and decides when each Lease is renewed. It does no I/O and
has no clock of its own: every method takes ``now`` (monotonic seconds).

The renewal rule (agent-gated; docs/agent-api.md):

- the first renewal of an attempt happens at the agent's first heartbeat for it
  (that renewal is what the operator takes as "Running"), but not before
  ``FIRST_RENEWAL_SECONDS`` (or half the heartbeat interval, if less) after the
  grant was seen: an agent that reports within that time writes only its report,
  and the operator commits it straight from Assigned (no Running write, no Running
  event: a quarter of a short task's API cost);
- after that a renewal is due every ``heartbeatIntervalSeconds`` (the task's, or a
  third of its lease), and happens only if the agent beat for that attempt within
  the last heartbeat interval; if it has not, nothing is renewed until it does,
  and a beat that arrives after the due time renews at once;
- a hung agent therefore loses its lease one lease duration after its last beat,
  while a slow agent that keeps beating keeps it for as long as it works.

What the agent is told when it cannot go on is an ``AgentError`` with an HTTP
status: 404 for a task this worker never held, 409 when the attempt's lease is
lost or the token is not the attempt's (the agent must stop), 409 ``Cancelled``
or ``DeadlineExceeded`` when the operator revoked the claim, 503 while the
sidecar does not hold its worker Lease.

A revoked claim (the operator's ``agentq.dev/revoked`` on its Lease) is renewed no
more and offered to no agent; once its agent has been told (or never beat for
it), the sidecar lets the Lease go (``releasable``) and the operator ends the task.

A claim of a task of another namespace (docs/tenancy.md, "Cross-namespace claims")
has its Lease here too, ``agentq-xtask-<task namespace>.<task>``; the agent knows
that attempt as ``<task namespace>~<task>`` (``protocol.cross_claim_id``), its
*task id*, which no task name can equal. Everything here is keyed by task id; the
Lease of an attempt is always its own ``lease_name``, never one made again from
the id.
"""

from __future__ import annotations

import datetime
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Literal

from agentq import protocol

Body = dict[str, Any]
State = Literal["pending", "active", "reported"]

# The least time from a grant to its first renewal (see the module docstring).
FIRST_RENEWAL_SECONDS = 1.0
# How many throttles an attempt keeps waiting for a write (one per budget at most).
MAX_PENDING_THROTTLES = protocol.MAX_USAGE_BUDGETS
# How many ended attempts are remembered, so a zombie agent asking about one is told
# "lost" (409) rather than "unknown" (404).
ENDED_MEMORY = 4096


class AgentError(Exception):
    """What to answer the agent: an HTTP status, a short code and a message."""

    def __init__(self, status: int, code: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "message": self.message, **self.details}


def revoked(task: str, token: int, reason: str) -> AgentError:
    """The claim was revoked: ``reason`` is the error code (Cancelled, DeadlineExceeded).
    ``fenceToken`` is above the attempt's: the agent fences its sink keys with it, so its
    own later writes are refused (docs/fencing.md)."""
    why = (
        "the task's activeDeadlineSeconds passed"
        if reason == protocol.REVOKE_DEADLINE
        else "the task was cancelled"
    )
    return AgentError(
        409,
        reason,
        f"the claim of task {task} (token {token}) is revoked: {why}; stop working on it",
        task=task,
        token=token,
        fenceToken=token + 1,
    )


def lease_lost(task: str, token: int, reason: str) -> AgentError:
    return AgentError(
        409,
        "LeaseLost",
        f"the lease of task {task} (token {token}) is lost: {reason}; stop working on it",
        task=task,
        token=token,
    )


@dataclass(frozen=True)
class LeaseView:
    """What the sidecar needs from a task Lease object."""

    name: str
    task: str
    holder: str | None
    token: int | None
    attempt: int
    task_uid: str | None
    resource_version: int | None
    duration: float | None
    revoked: str | None = None  # why the operator revoked the claim
    task_namespace: str | None = None  # a cross-namespace claim: the task's namespace

    @classmethod
    def of(cls, lease: Body) -> LeaseView | None:
        """Read a task Lease; None if it is not one (no task label nor owner)."""
        meta = lease.get("metadata") or {}
        spec = lease.get("spec") or {}
        annotations = meta.get("annotations") or {}
        labels = meta.get("labels") or {}
        owner = next(
            (
                ref
                for ref in meta.get("ownerReferences") or []
                if ref.get("kind") == "AgentTask" and ref.get("name")
            ),
            None,
        )
        name = str(meta.get("name") or "")
        task: str | None
        task_namespace = None
        if name.startswith(protocol.XTASK_LEASE_PREFIX):
            # A claim of another namespace's task: no owner (it cannot cross namespaces).
            # Its labels say which task (a name the CRD caps at 63 characters fits a label
            # whole), else its name; the agent knows it as ``<namespace>~<task>``.
            split = protocol.split_cross_task(name[len(protocol.XTASK_LEASE_PREFIX) :])
            task_namespace = labels.get(protocol.LABEL_TASK_NAMESPACE) or (split or ("",))[0]
            task_name = labels.get(protocol.LABEL_TASK) or (split or ("", ""))[1]
            task = (
                protocol.cross_claim_id(task_namespace, task_name)
                if task_namespace and task_name
                else None
            )
        else:
            task = str(owner["name"]) if owner else labels.get(protocol.LABEL_TASK)
        if not task or not name:
            return None
        uid = annotations.get(protocol.ANNOTATION_TASK_UID) or (owner or {}).get("uid")
        try:
            attempt = int(annotations.get(protocol.ANNOTATION_ATTEMPT) or 0)
        except ValueError:
            attempt = 0
        duration = spec.get("leaseDurationSeconds")
        return cls(
            name=str(meta["name"]),
            task=task,
            holder=spec.get("holderIdentity"),
            token=protocol.lease_token(annotations),
            attempt=attempt,
            task_uid=str(uid) if uid else None,
            resource_version=_rv(lease),
            duration=float(duration) if isinstance(duration, int | float) else None,
            revoked=_revoke_reason(annotations.get(protocol.ANNOTATION_REVOKED)),
            task_namespace=task_namespace or None,
        )


def _revoke_reason(text: object) -> str | None:
    if text is None:
        return None
    return text if text in protocol.REVOKE_REASONS else protocol.REVOKE_CANCELLED


def _rv(body: Body) -> int | None:
    try:
        return int(str((body.get("metadata") or {}).get("resourceVersion")))
    except ValueError:
        return None


@dataclass
class Attempt:
    """One grant of a task to this worker, and what the agent and the sidecar did with it."""

    task: str  # the task id the agent uses: the task's name, or <namespace>~<task>
    namespace: str  # the sidecar's: where the Lease is
    worker: str
    lease_name: str
    token: int
    attempt: int
    seen_at: float  # when the grant was first seen: the operator's timer started about then
    lease: Body  # the latest known Lease object (the body the next write starts from)
    state: State = "pending"  # pending: the task's payload is not read yet
    uid: str | None = None
    payload: Any = None
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 10.0
    renewed_at: float | None = None  # when our last successful write was sent
    beat_at: float | None = None  # the agent's last heartbeat
    beats: int = 0
    progress: str | None = None  # the agent's latest progress marker
    report: str | None = None  # the encoded report, once written
    sent_report: str | None = None  # a report whose write was sent (its outcome may be unknown)
    writes: int = 0  # writes in flight or waiting (never two at once: they take a lock)
    retry_at: float = 0.0  # after a failed write: not before
    failures: int = 0
    revoked: str | None = None  # the operator revoked the claim (why); renewed no more
    told: bool = False  # the agent was answered that it is revoked
    releasing: bool = False  # the Lease is being let go
    task_namespace: str | None = None  # a cross-namespace claim: the task's namespace
    # The budgets the task names (spec.budgets): name -> (requests, tokens) estimated.
    budgets: dict[str, tuple[int, int]] = field(default_factory=dict)
    # What the agent reported spent so far, cumulative (docs/budgets.md); goes on the
    # Lease as agentq.dev/usage with the next write.
    usage: dict[str, protocol.Usage] = field(default_factory=dict)
    # Throttles reported and not yet written (oldest first): each makes a write at once.
    throttles: list[protocol.Throttle] = field(default_factory=list)

    @property
    def cross(self) -> bool:
        """A claim of another namespace's task: its payload comes from the operator."""
        return self.lease_name.startswith(protocol.XTASK_LEASE_PREFIX)

    @property
    def expires_at(self) -> float:
        """When the operator will judge the lease expired if it is not renewed first.

        The operator starts its timer when it observes a change; our write was sent
        before that, so this is on the safe (early) side.
        """
        start = self.renewed_at if self.renewed_at is not None else self.seen_at
        return start + self.lease_seconds

    def due_at(self) -> float | None:
        """When the next renewal is due, or None while none is wanted (see the module doc)."""
        if self.state != "active" or self.writes or self.revoked:
            return None
        if self.throttles:
            # A provider's 429 pauses the budget for everyone: written at once, with
            # whatever else is new, whatever the cadence.
            return self.retry_at
        if self.beat_at is None:
            return None
        if self.renewed_at is None:
            # The first beat renews (the attempt is Running), a short while after the grant.
            grace = min(FIRST_RENEWAL_SECONDS, self.heartbeat_seconds / 2)
            cadence = max(self.beat_at, self.seen_at + grace)
        else:
            cadence = self.renewed_at + self.heartbeat_seconds
        if cadence > self.beat_at + self.heartbeat_seconds:
            return None  # the last beat will be too old by then: wait for the next one
        return max(cadence, self.beat_at, self.retry_at)

    def describe(self, now: float, wall: datetime.datetime) -> dict[str, Any]:
        """The attempt as the agent sees it (the HTTP API's Assignment object)."""
        remaining = self.expires_at - now
        deadline = wall + datetime.timedelta(seconds=remaining)
        out: dict[str, Any] = {
            "task": self.task,
            "namespace": self.task_namespace or self.namespace,
            "worker": self.worker,
            "uid": self.uid,
            "attempt": self.attempt,
            "token": self.token,
            "payload": self.payload,
            "leaseDurationSeconds": self.lease_seconds,
            "heartbeatIntervalSeconds": self.heartbeat_seconds,
            "leaseDeadline": deadline.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "leaseRemainingSeconds": round(max(0.0, remaining), 3),
            "state": self.state,
            "renewed": self.renewed_at is not None,
        }
        if self.progress is not None:
            out["progress"] = self.progress
        if self.state != "pending":
            out["budgets"] = [
                {"name": name, "requests": requests, "tokens": tokens}
                for name, (requests, tokens) in sorted(self.budgets.items())
            ]
        if self.usage:
            out["usage"] = protocol.usage_json(self.usage)
        return out

    def check_usage(self, reported: Any) -> dict[str, protocol.Usage]:
        """The attempt's cumulative usage after ``reported`` (the request's ``usage``,
        as sent), or 400 ``InvalidUsage``: a bad shape or amount, a budget the task does
        not name, an amount lower than its previous report. Changes nothing."""
        try:
            parsed = protocol.parse_usage(reported, previous=self.usage)
            return protocol.merge_usage(self.usage, parsed, named=self.budgets)
        except protocol.ProtocolError as err:
            raise AgentError(
                400, "InvalidUsage", str(err), field="usage", task=self.task, token=self.token
            ) from None

    def check_throttle(self, budget: str, seconds: float, ident: str) -> protocol.Throttle:
        """The throttle to write, or 400 ``InvalidThrottle`` for a budget the task does
        not name (its shape is checked by ``agent_input``). Changes nothing."""
        if budget not in self.budgets:
            listed = ", ".join(sorted(self.budgets)) or "none"
            raise AgentError(
                400,
                "InvalidThrottle",
                f"throttled for budget {budget!r}, which the task does not name "
                f"(its spec.budgets: {listed})",
                field="throttled",
                task=self.task,
                token=self.token,
            )
        return protocol.Throttle(budget=budget, retry_after_seconds=seconds, id=ident)

    def add_throttle(self, throttle: protocol.Throttle) -> None:
        """Keep ``throttle`` for the next write; one waiting for the same budget is
        replaced by whichever asks the longer pause."""
        for i, waiting in enumerate(self.throttles):
            if waiting.budget == throttle.budget:
                if throttle.retry_after_seconds >= waiting.retry_after_seconds:
                    self.throttles[i] = throttle
                return
        self.throttles.append(throttle)
        del self.throttles[:-MAX_PENDING_THROTTLES]

    def throttle_written(self, throttle: protocol.Throttle | None) -> None:
        if throttle is not None and throttle in self.throttles:
            self.throttles.remove(throttle)


@dataclass(frozen=True)
class Ended:
    """A remembered attempt that is over: lost, or ended after its report, or revoked."""

    task: str
    token: int
    reason: str
    report: str | None = None
    revoked: str | None = None
    usage: dict[str, protocol.Usage] = field(default_factory=dict)  # as last reported


@dataclass
class Attempts:
    """Every attempt this worker holds (by task), the ended ones, and a change counter."""

    namespace: str
    worker: str
    current: dict[str, Attempt] = field(default_factory=dict)
    ended: OrderedDict[tuple[str, int], Ended] = field(default_factory=OrderedDict)
    # Leases that existed when we took the worker Lease over from another holder: that
    # holder's agent may still be working on them with the same token, so they are not
    # ours to serve. They expire and the operator grants them again with new tokens.
    inherited: dict[str, int | None] = field(default_factory=dict)
    version: int = 0  # bumped whenever the listing changes (long-polls wait on it)
    # The version at the last change the agent did not cause itself: an attempt offered,
    # or one withdrawn before its report (revoked, lost). Not a report nor the end that
    # follows it: a long poll for offers (``?until=offers``) waits on this alone.
    offered: int = 0

    # -- what the watch says -----------------------------------------------------------

    def observe(self, lease: Body, now: float, *, serve_from_rv: int = 0) -> Attempt | None:
        """A task Lease was listed, added or modified. Returns an attempt that is new
        and needs its task read (``pending``), else None."""
        view = LeaseView.of(lease)
        if view is None:
            return None
        known = self.current.get(view.task)
        if view.holder != self.worker or view.token is None:
            if known is not None and known.lease_name == view.name:
                holder = view.holder or "nobody"
                self._end(known, f"the Lease is now held by {holder} with token {view.token}")
            return None
        if known is not None and known.token == view.token:
            if _newer(lease, known.lease):
                known.lease = slim(lease)
            self._report_seen(known, lease)
            if view.revoked is not None and known.revoked is None:
                withdrawn = known.state == "active"
                known.revoked = view.revoked
                self.version += 1  # no longer offered
                if withdrawn:
                    self.offered = self.version
            return None
        if known is not None and known.token > view.token:
            return None  # an old event of an earlier grant
        if view.name in self.inherited:
            if self.inherited[view.name] == view.token:
                return None
            del self.inherited[view.name]  # granted again since: a new attempt, ours
        if (view.task, view.token) in self.ended:
            return None  # a late event of an attempt that is over
        if serve_from_rv and (view.resource_version or 0) <= serve_from_rv:
            self.inherited[view.name] = view.token
            return None
        if known is not None:
            self._end(known, f"the task was granted again with token {view.token}")
        attempt = Attempt(
            task=view.task,
            namespace=self.namespace,
            worker=self.worker,
            lease_name=view.name,
            token=view.token,
            attempt=view.attempt,
            seen_at=now,
            lease=slim(lease),
            uid=view.task_uid,
            revoked=view.revoked,
            task_namespace=view.task_namespace,
            # A sidecar restarted in the pod takes the attempt back with what its agent
            # reported so far: a later report may not be lower.
            usage=protocol.lease_usage((lease.get("metadata") or {}).get("annotations")) or {},
        )
        if view.duration:
            attempt.lease_seconds = view.duration
            attempt.heartbeat_seconds = view.duration / 3
        self.current[view.task] = attempt
        return attempt

    def deleted(self, lease: Body) -> None:
        """A task Lease was deleted (or stopped matching our selector)."""
        view = LeaseView.of(lease)
        if view is None:
            return
        self.inherited.pop(view.name, None)
        known = self.current.get(view.task)
        if known is None or known.lease_name != view.name:
            return
        if view.token is not None and view.token < known.token:
            return  # the deletion of an earlier grant
        if known.state == "reported":
            self._end(known, "the attempt ended after its report")
        else:
            self._end(known, "its Lease was deleted (reclaimed, requeued, or the task deleted)")

    def resync(self, leases: list[Body], now: float, *, serve_from_rv: int = 0) -> list[Attempt]:
        """A fresh listing: what is not in it any more is gone. Returns new attempts."""
        present = {view.name: lease for lease in leases if (view := LeaseView.of(lease))}
        for attempt in list(self.current.values()):
            if attempt.lease_name not in present:
                self.deleted(attempt.lease)
        for name in list(self.inherited):
            if name not in present:
                del self.inherited[name]
        new = []
        for lease in present.values():
            created = self.observe(lease, now, serve_from_rv=serve_from_rv)
            if created is not None:
                new.append(created)
        return new

    def activate(
        self,
        attempt: Attempt,
        *,
        uid: str | None,
        payload: Any,
        lease_seconds: float,
        heartbeat_seconds: float,
        budgets: dict[str, tuple[int, int]] | None = None,
    ) -> bool:
        """The task was read: the attempt is offered to the agent. False if it is stale."""
        if self.current.get(attempt.task) is not attempt or attempt.state != "pending":
            return False
        if attempt.uid is not None and uid is not None and attempt.uid != uid:
            self._end(attempt, "the Lease belongs to an earlier task of the same name")
            return False
        attempt.uid = uid
        attempt.payload = payload
        attempt.lease_seconds = lease_seconds
        attempt.heartbeat_seconds = heartbeat_seconds
        attempt.budgets = dict(budgets or {})
        attempt.state = "active"
        self.version += 1
        if attempt.revoked is None:
            self.offered = self.version
        return True

    def drop(self, attempt: Attempt, reason: str) -> None:
        """The attempt cannot be served (its task is gone or unreadable for good)."""
        if self.current.get(attempt.task) is attempt:
            self._end(attempt, reason)

    def lose_all(self, reason: str) -> None:
        for attempt in list(self.current.values()):
            self._end(attempt, reason)

    # -- what the agent says ------------------------------------------------------------

    def find(self, task: str, token: int) -> Attempt:
        """The live attempt of ``task`` with ``token``, or the AgentError to answer."""
        attempt = self.current.get(task)
        if attempt is not None and attempt.token == token and attempt.state != "pending":
            if attempt.revoked is not None and attempt.report is None:
                attempt.told = True  # answered now: its Lease may be let go
                self.version += 1
                raise revoked(task, token, attempt.revoked)
            return attempt
        ended = self.ended.get((task, token))
        if ended is not None:
            if ended.revoked is not None and ended.report is None:
                raise revoked(task, token, ended.revoked)
            if ended.report is not None:
                raise AgentError(
                    409,
                    "AttemptEnded",
                    f"attempt of task {task} with token {token} is over: {ended.reason}",
                    task=task,
                    token=token,
                )
            raise lease_lost(task, token, ended.reason)
        if any(
            name in self.inherited and self.inherited[name] == token for name in lease_names(task)
        ):
            raise lease_lost(
                task,
                token,
                "it was granted to this worker before this sidecar took the worker Lease over "
                "from another holder; it will expire and be granted again with a new token",
            )
        if attempt is not None and attempt.state != "pending":
            kind = "older than" if token < attempt.token else "not"
            raise AgentError(
                409,
                "StaleToken",
                f"token {token} is {kind} the token of the current attempt of task {task} "
                f"on this worker ({attempt.token}); stop working on it",
                task=task,
                token=token,
                currentToken=attempt.token,
            )
        if any(key[0] == task for key in self.ended):
            raise lease_lost(task, token, "no attempt of it with this token is held here")
        raise AgentError(
            404, "UnknownTask", f"task {task} is not assigned to worker {self.worker}", task=task
        )

    def beat(
        self,
        task: str,
        token: int,
        progress: str | None,
        now: float,
        *,
        usage: dict[str, protocol.Usage] | None = None,
        throttle: protocol.Throttle | None = None,
    ) -> Attempt:
        """A heartbeat; ``usage`` (the new cumulative total, from ``check_usage``) and
        ``throttle`` (from ``check_throttle``) ride the next write."""
        attempt = self.find(task, token)
        if attempt.state == "active":
            attempt.beat_at = now
            attempt.beats += 1
            if progress is not None:
                attempt.progress = progress
            if usage is not None:
                attempt.usage = usage
            if throttle is not None:
                attempt.add_throttle(throttle)
        return attempt

    def ended_usage(self, task: str, token: int) -> dict[str, protocol.Usage]:
        ended = self.ended.get((task, token))
        return ended.usage if ended is not None else {}

    def ended_report(self, task: str, token: int) -> str | None:
        ended = self.ended.get((task, token))
        return ended.report if ended is not None else None

    # -- what the writes did --------------------------------------------------------

    def renewed(self, attempt: Attempt, lease: Body, sent_at: float) -> None:
        attempt.lease = slim(lease)
        attempt.renewed_at = sent_at
        attempt.failures = 0
        attempt.retry_at = 0.0

    def reported(
        self,
        attempt: Attempt,
        lease: Body,
        report: str,
        sent_at: float,
        usage: dict[str, protocol.Usage] | None = None,
    ) -> None:
        self.renewed(attempt, lease, sent_at)
        if usage is not None:
            attempt.usage = usage
        attempt.throttles.clear()  # the report's write carried the one it could
        attempt.report = report
        attempt.state = "reported"
        self.version += 1

    def write_failed(self, attempt: Attempt, now: float, *, retry_in: float) -> None:
        attempt.failures += 1
        attempt.retry_at = now + retry_in

    def lost(self, attempt: Attempt, reason: str) -> None:
        if self.current.get(attempt.task) is attempt:
            self._end(attempt, reason)

    # -- the renewal loop's view ------------------------------------------------------------

    def due(self, now: float) -> list[Attempt]:
        return [a for a in self.current.values() if (due := a.due_at()) is not None and due <= now]

    def next_due(self) -> float | None:
        times = [due for a in self.current.values() if (due := a.due_at()) is not None]
        return min(times) if times else None

    def listing(self) -> list[Attempt]:
        return sorted(
            (a for a in self.current.values() if _listed(a)),
            key=lambda a: (a.seen_at, a.task),
        )

    def any_listed(self) -> bool:
        return any(_listed(a) for a in self.current.values())

    def releasable(self) -> list[Attempt]:
        """Revoked attempts whose Lease may be let go: the agent was told, or never beat
        for it (it may not have started), and no write of it is under way."""
        return [
            a
            for a in self.current.values()
            if a.revoked is not None
            and not a.releasing
            and not a.writes
            and a.report is None
            and (a.told or a.beats == 0)
        ]

    def released(self, attempt: Attempt) -> None:
        """Its Lease was let go (or is gone): the attempt is over."""
        if self.current.get(attempt.task) is attempt:
            self._end(attempt, f"the claim was revoked ({attempt.revoked}) and let go")

    # -- internals --------------------------------------------------------------------

    def _report_seen(self, attempt: Attempt, lease: Body) -> None:
        """The Lease shows the report we sent: it was written, even if its write had an
        unknown outcome (the agent, told to retry, must then hear it was taken, also once
        the operator has committed it and deleted the Lease)."""
        annotations = (lease.get("metadata") or {}).get("annotations") or {}
        sent = attempt.sent_report
        if (
            attempt.state == "active"
            and sent
            and annotations.get(protocol.ANNOTATION_REPORT) == sent
        ):
            attempt.report = sent
            attempt.usage = protocol.lease_usage(annotations) or attempt.usage
            attempt.throttles.clear()
            attempt.state = "reported"
            self.version += 1

    def _end(self, attempt: Attempt, reason: str) -> None:
        withdrawn = attempt.state == "active" and attempt.revoked is None
        del self.current[attempt.task]
        self.ended[(attempt.task, attempt.token)] = Ended(
            attempt.task, attempt.token, reason, attempt.report, attempt.revoked, attempt.usage
        )
        while len(self.ended) > ENDED_MEMORY:
            self.ended.popitem(last=False)
        self.version += 1
        if withdrawn:
            self.offered = self.version


def lease_names(task: str) -> tuple[str, ...]:
    """The name the Lease of task id ``task`` has: a cross-namespace claim's
    (``<namespace>~<task>``), else a task of this namespace's."""
    split = protocol.split_claim_id(task)
    if split is not None:
        return (protocol.cross_task_lease_name(*split),)
    return (protocol.task_lease_name(task),)


def _listed(attempt: Attempt) -> bool:
    """Offered to the agent: its task is read and its claim is not revoked."""
    return attempt.state != "pending" and attempt.revoked is None


def _newer(new: Body, old: Body) -> bool:
    a, b = _rv(new), _rv(old)
    return a is None or b is None or a > b


def slim(body: Body) -> Body:
    """An object without ``managedFields``: smaller to keep and to send (a replace that
    omits them keeps the server's)."""
    meta = dict(body.get("metadata") or {})
    meta.pop("managedFields", None)
    return {**body, "metadata": meta}
