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
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentq import claims, lifecycle, protocol, views
from agentq.claims import Decision, LeaseOp
from agentq.clock import micro_rfc3339
from agentq.models import TaskPhase
from agentq.operator import metrics
from agentq.operator.cache import TIMER_TASK
from agentq.operator.events import Involved
from agentq.operator.port import Body, KubeError, NotLeading, Status
from agentq.views import Key, LeaseView, TaskView

if TYPE_CHECKING:
    from agentq.operator.controller import Controller

log = logging.getLogger("agentq.controller")

RETRY_SECONDS = 1.0  # after an unknown outcome, look again this much later
UNWRITABLE_SECONDS = 600.0  # after a write the API server refuses for good


@dataclass
class Grace:
    """A grace period started for the claim with ``token``; ends at ``deadline``."""

    token: int
    deadline: float  # monotonic


class Committer:
    """Applies decisions through the controller's port and slots (see the module docstring)."""

    def __init__(self, controller: Controller) -> None:
        self.c = controller
        self._deleting: set[Key] = set()  # Leases whose delete is on its way

    async def apply(
        self, task: TaskView, lease: LeaseView | None, decision: Decision, credits: int
    ) -> None:
        """``credits``: ``Controller.credits`` when the decision was made."""
        c = self.c
        key = task.key
        try:
            await self._apply_decision(task, lease, decision, credits)
        except NotLeading:
            # Not sent (see Controller.call): looked at again if we still lead then.
            c.push_timer(c.clock.monotonic() + RETRY_SECONDS, (TIMER_TASK, key))
        except KubeError as err:
            c.stats.unknown += 1
            log.warning("write for %s/%s had an unknown outcome: %s", *key, err)
            c.push_timer(c.clock.monotonic() + RETRY_SECONDS, (TIMER_TASK, key))
        finally:
            c.done(key)
            c.redecide_if_changed(task, lease)

    async def _apply_decision(
        self, task: TaskView, lease: LeaseView | None, decision: Decision, credits: int
    ) -> None:
        c = self.c
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
            current = await c.confirmer.read(lease)
            if current.ok and current.body is not None:
                if current.body["metadata"].get("resourceVersion") != lease.resource_version:
                    c.stats.expiries_dropped += 1
                    log.info("lease %s/%s changed after all; not expired", *lease.key)
                    c.observe_lease(current.body)
                    return
            elif current.status is Status.GONE:
                c.observe_lease(gone(lease), deleted=True)
                return
        if decision.confirm_expiry and c.credits != credits:
            # Time was given back to every Lease since the expiry was judged (the API
            # server answered nothing for a while, its reply to the read above maybe the
            # first thing it said): the holder could not renew meanwhile. Decide again.
            c.stats.expiries_dropped += 1
            log.info("expiry of %s/%s not committed: time was given back to the leases", *key)
            c.push_timer(c.clock.monotonic(), (TIMER_TASK, key))
            return
        if transition is not None:
            committed = await self.commit(task, transition, decision)
            if not committed:
                return
            if refusal is not None and lease is not None:
                self._refuse(task, lease, refusal)
        if decision.lease is LeaseOp.DELETE and lease is not None:
            # Tidying up: the decision is committed; its task is not held up by this.
            c.spawn(self.delete_lease(key, lease))
        elif decision.lease is LeaseOp.WRITE_GRANT:
            granted = c.tasks.get(key)
            if granted is not None and granted.active:
                await self.write_grant(granted, c.leases.get(c.task_lease_key(granted)))

    async def delete_lease(self, key: Key, lease: LeaseView) -> None:
        """Delete the Lease of an attempt that ended -- the one the decision saw: if it
        changed since (a new grant replaced it), the delete is refused (409) and the
        Lease stays. It tells a holder that is still alive at once that it lost the
        claim; nothing else waits on it, so it goes out after the decisions' requests."""
        c = self.c
        if lease.key in self._deleting:
            return
        self._deleting.add(lease.key)
        try:
            reply = await c.call_low(
                c.kube.delete_lease, lease.namespace, lease.name, lease.resource_version
            )
        except KubeError as err:
            log.info("deleting Lease %s/%s had an unknown outcome: %s", *lease.key, err)
            c.push_timer(c.clock.monotonic() + RETRY_SECONDS, (TIMER_TASK, key))  # decide again
            return
        finally:
            self._deleting.discard(lease.key)
        if reply.ok or reply.status is Status.GONE:
            c.observe_lease(gone(lease), deleted=True)

    def _refuse(self, task: TaskView, lease: LeaseView, refusal: claims.Refusal) -> None:
        c = self.c
        c.refused[lease.key] = lease.report or ""
        if refusal.stale:
            metrics.STALE_REPORTS.inc()
        else:
            metrics.UNPROCESSABLE.labels("Report", "Unreadable").inc()
        c.events.record(
            involved(task), reason=refusal.reason, message=refusal.message, warning=True
        )
        log.warning("refused a report on %s/%s: %s", task.namespace, task.name, refusal.message)

    async def commit(
        self, task: TaskView, transition: lifecycle.Transition, decision: Decision
    ) -> bool:
        """Write ``transition`` with a CAS on the task; record its events and metrics."""
        c = self.c
        key = task.key
        reply = await c.write_task_status(task, transition.patch)
        if reply.status is Status.INVALID:
            await self.refused_for_good(task, transition, reply.message)
            return False
        if not reply.ok or reply.body is None:
            c.stats.conflicts += 1
            metrics.COMMIT_CONFLICTS.labels("AgentTask").inc()
            log.info("%s of %s/%s lost a race; will re-decide", transition.reason or "update", *key)
            return False
        now = c.clock.monotonic()
        if decision.confirm_expiry:
            self._expiry_lag(task, now)
        c.observe_task(reply.body)
        updated = c.tasks.get(key, task)
        if "progress" in transition.patch:
            c.progress_written[key] = now
        if decision.grace_deadline is not None:
            c.grace[key] = Grace(task.status.fencing_token or 0, decision.grace_deadline)
            c.push_timer(decision.grace_deadline, (TIMER_TASK, key))
        if decision.suspect is not None:
            c.ready.expired_claim((task.namespace, decision.suspect), now)
        if decision.completion is not None:
            metrics.COMPLETIONS.labels(decision.completion).inc()
        if decision.unprocessable is not None:
            metrics.UNPROCESSABLE.labels(*decision.unprocessable).inc()
        self.record(updated, transition)
        return True

    def _expiry_lag(self, task: TaskView, now: float) -> None:
        """How late an expiry decision was committed: from the claim's expiry (or the end
        of the grace period it was given) by our clock."""
        c = self.c
        due = c.claim_expires_at(task)
        grace = c.grace.get(task.key)
        if due is not None and grace is not None and grace.token == task.status.fencing_token:
            due = max(due, grace.deadline)
        if due is not None and due <= now:
            metrics.EXPIRY_LAG.observe(now - due)

    async def refused_for_good(
        self, task: TaskView, transition: lifecycle.Transition, message: str
    ) -> None:
        """The API server will never take this write (422 / too large). Fail the attempt
        (or the task) saying why, with a smaller write; if even that is refused, say so
        in an Event and stop trying for a while -- never a retry every pass."""
        c = self.c
        key = task.key
        log.error("status write of %s/%s refused: %s", *key, message)
        metrics.UNPROCESSABLE.labels("AgentTask", "StatusRefused").inc()
        fallback: lifecycle.Transition | None = None
        now = c.clock.now()
        if transition.phase is not TaskPhase.FAILED or "error" not in transition.patch:
            fallback = lifecycle.unprocessable(
                task.status,
                reason="StatusRefused",
                message=f"the API server refused the task's status: {message}",
                now=now,
            )
        if fallback is not None:
            reply = await c.write_task_status(task, fallback.patch)
            if reply.ok and reply.body is not None:
                c.observe_task(reply.body)
                self.record(c.tasks.get(key, task), fallback)
                return
            if reply.status is not Status.INVALID:
                return  # a race: decide again
        c.unwritable[key] = c.clock.monotonic() + UNWRITABLE_SECONDS
        c.events.record(
            involved(task),
            reason="Unprocessable",
            message=f"the API server refuses every status write of this task: {message}",
            warning=True,
        )

    def record(self, task: TaskView, transition: lifecycle.Transition) -> None:
        c = self.c
        about = involved(task)
        for reason, message, warning in transition.extra_events:
            c.events.record(about, reason=reason, message=message, warning=warning)
        if transition.reason:
            c.events.record(
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
            metrics.RECLAIMS.labels(reason).inc()
        if phase is TaskPhase.DEAD_LETTERED:
            metrics.DEAD_LETTERS.labels(task.namespace).inc()
        if phase is TaskPhase.HELD:
            metrics.HELD.inc()

    def grant_lease_body(self, task: TaskView) -> Body:
        c = self.c
        status = task.status
        now = micro_rfc3339(c.clock.now())
        worker = str(status.worker)
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": protocol.task_lease_name(task.name),
                "namespace": task.namespace,
                "labels": {
                    protocol.LABEL_LEASE_KIND: protocol.LEASE_KIND_TASK,
                    protocol.LABEL_TASK: protocol.label_value(task.name),
                    protocol.LABEL_WORKER: protocol.label_value(worker),
                },
                "annotations": {
                    protocol.ANNOTATION_TOKEN: str(status.fencing_token),
                    protocol.ANNOTATION_ATTEMPT: str(status.attempt or 1),
                    protocol.ANNOTATION_TASK_UID: task.uid,
                },
                "ownerReferences": [
                    {
                        "apiVersion": "agentq.dev/v1alpha1",
                        "kind": "AgentTask",
                        "name": task.name,
                        "uid": task.uid,
                        "controller": True,
                        "blockOwnerDeletion": False,
                    }
                ],
            },
            "spec": {
                "holderIdentity": worker,
                "leaseDurationSeconds": task.spec.lease_duration_seconds,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": max(0, (status.attempt or 1) - 1),
            },
        }

    async def write_grant(self, task: TaskView, lease: LeaseView | None) -> None:
        """Create the grant's Lease, or raise an older one to it -- never lower a token.

        A Lease of another task of this name (deleted and re-created) is replaced; one
        that already carries this token or a higher one is left for ``decide`` to judge.
        """
        c = self.c
        body = self.grant_lease_body(task)
        name = body["metadata"]["name"]
        token = task.status.fencing_token or 0
        for _ in range(4):
            if lease is None:
                body["metadata"].pop("resourceVersion", None)  # a create carries none
                reply = await c.call(c.kube.create_lease, task.namespace, body)
                if reply.status is Status.CONFLICT:
                    got = await c.call(c.kube.get_lease, task.namespace, name)
                    if got.ok and got.body is not None:
                        c.observe_lease(got.body)
                        lease = views.lease_view(got.body)
                    continue
            else:
                foreign = claims.lease_foreign(task, lease)
                if not foreign and lease.token is not None and lease.token >= token:
                    return
                body["metadata"]["resourceVersion"] = lease.resource_version
                reply = await c.call(c.kube.replace_lease, task.namespace, name, body)
                if reply.status in (Status.CONFLICT, Status.GONE):
                    lease = None
                    continue
            if reply.ok and reply.body is not None:
                c.observe_lease(reply.body)
            elif reply.status is Status.INVALID:
                log.error(
                    "grant Lease of %s/%s refused: %s", task.namespace, task.name, reply.message
                )
            return


def gone(lease: LeaseView) -> Body:
    return {
        "metadata": {
            "namespace": lease.namespace,
            "name": lease.name,
            "resourceVersion": lease.resource_version,
        }
    }


def involved(task: TaskView) -> Involved:
    return Involved(
        kind="AgentTask",
        namespace=task.namespace,
        name=task.name,
        uid=task.uid,
        resource_version=task.resource_version,
    )


__all__ = ["RETRY_SECONDS", "Committer", "Grace", "gone", "involved"]
