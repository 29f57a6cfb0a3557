"""Applying claim decisions: the writes of one decision, in order, with compare-and-swap.

``agentq.claims.decide`` returns a ``Decision``; the ``Committer`` makes it real:

1. an expiry is confirmed first (a stalled watch looks exactly like a dead
   holder): the Lease is read again (``confirm.ExpiryConfirmer``: one read per
   worker for the claims of a worker that died) and the decision dropped if it
   changed -- or if time was given back to every Lease meanwhile (the operator
   was stopped, or the API server answered nothing: ``silence``);
2. the status transition is written with a CAS on the resourceVersion the
   decision was made on; a 409 or 404 drops it (the next event decides again),
   a write the API server will never accept (422, too large) becomes a visible
   state (``refused_for_good``) instead of a retry every pass;
3. what the transition says about the Lease: delete it (``delete_lease``, off the
   decision's path: low priority, and the task is free to be decided again), or
   write the grant's (``write_grant``: create, or raise an older one -- never lower
   a token, and replace an ended attempt's Lease that is still there);
4. its Events and metrics (``record``), off the decision path.

An unknown outcome (timeout, 5xx) drops the decision too, and the task is looked
at again ``RETRY_SECONDS`` later.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agentq import claims, lifecycle
from agentq.claims import Decision, LeaseOp
from agentq.clock import Clock
from agentq.models import TASK_PLURAL, TaskPhase
from agentq.operator import metrics
from agentq.operator.confirm import ExpiryConfirmer
from agentq.operator.events import EventSink, Involved
from agentq.operator.gate import RequestGate
from agentq.operator.leases import ClaimLeases, gone
from agentq.operator.port import Body, Kube, KubeError, NotLeading, Reply, Status
from agentq.operator.readiness import WorkerReadiness
from agentq.operator.records import Grace
from agentq.operator.store import Store
from agentq.operator.work import REFUSED_SECONDS, TIMER_TASK, Agenda, Retries, Stats
from agentq.views import LeaseView, TaskView

__all__ = ["Committer", "involved"]

log = logging.getLogger("agentq.controller")

# The reasons the operator gives a failed attempt itself (agentq_reclaims_total{reason});
# any other is an agent's report ("Reported").
OPERATOR_REASONS = frozenset(
    {
        "LeaseExpired",
        "LeaseReleased",
        "LeaseTampered",
        "LeaseUnwritable",
        "ProgressDeadlineExceeded",
        "InvalidReport",
        "StatusRefused",
        "Unknown",
    }
)


class Committer:
    """Applies decisions through the request gate (see the module docstring)."""

    def __init__(
        self,
        *,
        store: Store,
        agenda: Agenda,
        gate: RequestGate,
        kube: Kube,
        events: EventSink,
        clock: Clock,
        confirmer: ExpiryConfirmer,
        readiness: WorkerReadiness,
        leases: ClaimLeases,
        retries: Retries,
        stats: Stats,
        credits: Callable[[], int],
        accounted: Callable[[TaskView, int], list[dict[str, Any]] | None] = lambda t, n: None,
    ) -> None:
        self.store = store
        self.agenda = agenda
        self.gate = gate
        self.kube = kube
        self.events = events
        self.clock = clock
        self.confirmer = confirmer
        self.readiness = readiness
        self.leases = leases
        self.retries = retries
        self.stats = stats
        # How many times time was given back to every Lease (a stall, a silence): an
        # expiry decided before the count moved is decided again, not committed.
        self.credits = credits
        # What the attempt with this fencing token was accounted on its budgets, while
        # the budget book holds its grant (``Budgets.accounted``).
        self.accounted = accounted

    def write_ended(self, task: TaskView, lease: LeaseView | None, ticket: int) -> None:
        """The write ``ticket`` about ``task`` ended: decide it again if something asked
        meanwhile, or if what the decision was made on has changed (else a lost race
        would be retried on the same stale state; the watch event that tells us what
        changed marks the task again)."""
        key = task.key
        if self.store.end_write(key, ticket):
            self.agenda.decide(key)
            return
        record = self.store.tasks.get(key)
        if record is None or record.write != ticket:
            return
        now_lease = self.store.lease_of(task)
        if record.view.resource_version != task.resource_version or (
            (now_lease.view.resource_version if now_lease else None)
            != (lease.resource_version if lease else None)
        ):
            self.agenda.decide(key)
        else:
            self.agenda.poke()  # it may be queued again

    async def apply(
        self, task: TaskView, lease: LeaseView | None, decision: Decision, credits: int, ticket: int
    ) -> None:
        """``credits``: the count of give-backs when the decision was made; ``ticket``: the
        write's (``Store.start_write``)."""
        key = task.key
        try:
            await self._apply_decision(task, lease, decision, credits)
        except NotLeading:
            # Not sent (see RequestGate.call): looked at again if we still lead then.
            self.retries.later(key)
        except KubeError as err:
            self.stats.unknown += 1
            log.warning("write for %s/%s had an unknown outcome: %s", *key, err)
            self.retries.later(key)
        finally:
            self.write_ended(task, lease, ticket)

    async def _apply_decision(
        self, task: TaskView, lease: LeaseView | None, decision: Decision, credits: int
    ) -> None:
        key = task.key
        transition = decision.transition
        refusal = decision.refusal
        if refusal is not None and (lease is None or lease.report is None):
            refusal = None
        if refusal is not None:
            counted = lifecycle.refused(task.status)
            transition = counted if transition is None else transition.then(counted)
        if decision.confirm_expiry and lease is not None:
            # A stalled watch looks exactly like a dead holder: read the Lease itself.
            current = await self.confirmer.read(lease)
            if current.ok and current.body is not None:
                if current.body["metadata"].get("resourceVersion") != lease.resource_version:
                    self.stats.expiries_dropped += 1
                    log.info("lease %s/%s changed after all; not expired", *lease.key)
                    self.leases.observe(current.body)
                    return
            elif current.status is Status.GONE:
                self.leases.observe(gone(lease), deleted=True)
                return
        if decision.confirm_expiry and self.credits() != credits:
            # Time was given back to every Lease since the expiry was judged (the API
            # server answered nothing for a while, its reply to the read above maybe the
            # first thing it said): the holder could not renew meanwhile. Decide again.
            self.stats.expiries_dropped += 1
            log.info("expiry of %s/%s not committed: time was given back to the leases", *key)
            self.retries.later(key, 0.0)
            return
        if transition is not None:
            committed = await self.commit(task, transition, decision)
            if not committed:
                return
            if refusal is not None and lease is not None:
                self._refuse(task, lease, refusal)
        if decision.lease is LeaseOp.DELETE and lease is not None:
            # Tidying up: the decision is committed; its task is not held up by this.
            self.gate.spawn(self.leases.delete(key, lease))
        elif decision.lease is LeaseOp.REVOKE and lease is not None and decision.revoke:
            claimed = self.store.task(key)
            if claimed is not None and claimed.active:
                await self.leases.revoke(claimed, lease, decision.revoke)
        elif decision.lease is LeaseOp.WRITE_GRANT:
            granted = self.store.task(key)
            if granted is not None and granted.active:
                current_lease = self.store.lease_of(granted)
                await self.leases.write_grant(
                    granted, current_lease.view if current_lease else None
                )

    def _refuse(self, task: TaskView, lease: LeaseView, refusal: claims.Refusal) -> None:
        record = self.store.leases.get(lease.key)
        if record is not None:
            record.refused_report = lease.report or ""
        if refusal.stale:
            metrics.STALE_REPORTS.inc()
        else:
            metrics.UNPROCESSABLE.labels("Report", "Unreadable").inc()
        self.events.record(
            involved(task), reason=refusal.reason, message=refusal.message, warning=True
        )
        log.warning("refused a report on %s/%s: %s", task.namespace, task.name, refusal.message)

    async def write_status(self, task: TaskView, patch: Body) -> Reply:
        """A decision's status write: a CAS on the resourceVersion it was decided on. One
        that ends an attempt of a task naming budgets (a new ``history`` entry for the
        attempt the budget book holds) carries what it was accounted (``usage``): a new
        leader restores the budgets from it (docs/budgets.md)."""
        history = patch.get("history")
        if task.spec.budgets and isinstance(history, list) and history:
            last = history[-1]
            token = last.get("token") if isinstance(last, dict) else None
            if isinstance(token, int) and "usage" not in last:
                usage = self.accounted(task, token)
                if usage:
                    patch = {**patch, "history": [*history[:-1], {**last, "usage": usage}]}
        return await self.gate.call(
            self.kube.patch_status,
            TASK_PLURAL,
            task.namespace,
            task.name,
            task.resource_version,
            patch,
        )

    def refused_by_rbac(self, task: TaskView, message: str) -> None:
        """A write of ours was refused for our credentials (401/403): not the task's fault,
        nothing it can change. Said loudly, looked at again much later."""
        self.stats.refused += 1
        metrics.UNPROCESSABLE.labels("AgentTask", "Forbidden").inc()
        log.error("status write of %s/%s forbidden: %s", task.namespace, task.name, message)
        self.retries.later(task.key, REFUSED_SECONDS)

    async def commit(
        self, task: TaskView, transition: lifecycle.Transition, decision: Decision
    ) -> bool:
        """Write ``transition`` with a CAS on the task; record its events and metrics."""
        key = task.key
        reply = await self.write_status(task, transition.patch)
        if reply.status is Status.INVALID:
            await self.refused_for_good(task, transition, reply.message)
            return False
        if reply.status is Status.FORBIDDEN:
            self.refused_by_rbac(task, reply.message)
            return False
        if not reply.ok or reply.body is None:
            # 409 / 404: the task changed or went: its event decides again.
            self.stats.conflicts += 1
            metrics.COMMIT_CONFLICTS.labels("AgentTask").inc()
            log.info("%s of %s/%s lost a race; will re-decide", transition.reason or "update", *key)
            record = self.store.tasks.get(key)
            if record is not None:
                record.lost_race_at = task.resource_version
            return False
        now = self.clock.monotonic()
        if decision.confirm_expiry:
            self._expiry_lag(task, now)
        updated = self.store.observe_task(reply.body) or task
        record = self.store.tasks.get(key)
        if record is not None:
            if "progress" in transition.patch:
                record.progress_written = now
            if decision.grace_deadline is not None:
                record.grace = Grace(task.status.fencing_token or 0, decision.grace_deadline)
                self.agenda.at(decision.grace_deadline, (TIMER_TASK, key))
        if decision.suspect is not None:
            # The holder is a worker of the claim's namespace (the task's own, or -- a
            # claim across namespaces -- status.workerNamespace).
            holder_ns = task.status.worker_namespace or task.namespace
            self.readiness.expired_claim((holder_ns, decision.suspect), now)
        if decision.completion is not None:
            metrics.COMPLETIONS.labels(decision.completion).inc()
        if decision.unprocessable is not None:
            metrics.UNPROCESSABLE.labels(*decision.unprocessable).inc()
        self.record(updated, transition)
        return True

    def _expiry_lag(self, task: TaskView, now: float) -> None:
        """How late an expiry decision was committed: from the claim's expiry (or the end
        of the grace period it was given) by our clock."""
        due = self.store.claim_expires_at(task)
        record = self.store.tasks.get(task.key)
        grace = record.grace if record is not None else None
        if due is not None and grace is not None and grace.token == task.status.fencing_token:
            due = max(due, grace.deadline)
        if due is not None and due <= now:
            metrics.EXPIRY_LAG.observe(now - due)

    async def refused_for_good(
        self, task: TaskView, transition: lifecycle.Transition, message: str
    ) -> None:
        """The API server will never take this write (422 / too large). Fail the task
        saying why, in a smaller write -- for an object too large for etcd, smaller and
        smaller ones (``lifecycle.too_large``: its reason ``ObjectTooLarge``); if even the
        smallest is refused, say so in an Event and stop trying for a while -- never a
        retry every pass."""
        key = task.key
        log.error("status write of %s/%s refused: %s", *key, message)
        now = self.clock.now()
        too_large = "too large" in message.lower()
        fallbacks: tuple[lifecycle.Transition, ...] = ()
        if too_large:
            fallbacks = lifecycle.too_large(task.status, now=now)
        else:
            metrics.UNPROCESSABLE.labels("AgentTask", "StatusRefused").inc()
            if transition.phase is not TaskPhase.FAILED or "error" not in transition.patch:
                fallbacks = (
                    lifecycle.unprocessable(
                        task.status,
                        reason="StatusRefused",
                        message=f"the API server refused the task's status: {message}",
                        now=now,
                    ),
                )
        for fallback in fallbacks:
            reply = await self.write_status(task, fallback.patch)
            if reply.ok and reply.body is not None:
                if too_large:
                    metrics.UNPROCESSABLE.labels("AgentTask", lifecycle.OBJECT_TOO_LARGE).inc()
                self.record(self.store.observe_task(reply.body) or task, fallback)
                return
            if reply.status is not Status.INVALID:
                return  # a race: decide again
        self.retries.left_alone(key)
        if too_large:
            # Nothing the operator may touch is left to make room on: the object is the
            # user's metadata and spec alone (docs/operator.md, "Known limits").
            metrics.UNPROCESSABLE.labels("AgentTask", "Unwritable").inc()
            said = (
                "the object is too large for etcd to take any write of its status (it is "
                "within a few dozen bytes of the request limit): it cannot be processed, "
                f"and stays as it is; delete it (large inputs belong outside the task): {message}"
            )
        else:
            said = f"the API server refuses every status write of this task: {message}"
        self.events.record(involved(task), reason="Unprocessable", message=said, warning=True)

    def record(self, task: TaskView, transition: lifecycle.Transition) -> None:
        about = involved(task)
        for reason, message, warning in transition.extra_events:
            self.events.record(about, reason=reason, message=message, warning=warning)
        if transition.reason:
            self.events.record(
                about,
                reason=transition.reason,
                message=transition.message,
                warning=transition.warning,
            )
            log.info(
                "%s/%s %s: %s", task.namespace, task.name, transition.reason, transition.message
            )
        phase = transition.phase
        if transition.reason in ("Reclaimed", "DeadLettered"):
            reason = str((transition.patch.get("error") or {}).get("reason") or "Unknown")
            # An agent's reason is free text: a label from a bounded set, always.
            metrics.RECLAIMS.labels(reason if reason in OPERATOR_REASONS else "Reported").inc()
        if phase is TaskPhase.DEAD_LETTERED:
            metrics.DEAD_LETTERS.labels(task.namespace).inc()
        if phase is TaskPhase.HELD:
            metrics.HELD.inc()


def involved(task: TaskView) -> Involved:
    return Involved(
        kind="AgentTask",
        namespace=task.namespace,
        name=task.name,
        uid=task.uid,
        resource_version=task.resource_version,
    )
