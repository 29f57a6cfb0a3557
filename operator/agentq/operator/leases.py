"""The claim Leases the operator writes: a grant's Lease, and an ended attempt's deleted.

- ``write_grant``: create the grant's Lease, or raise an older one to it --
  never lower a token -- and replace a Lease of an earlier task of the same name
  (deleted and re-created); a create that finds one already there reads it and
  tries again; a Lease the API server refuses for good leaves the task alone
  for a while (``UNWRITABLE_SECONDS``) instead of a retry every pass.
- ``delete``: the Lease of an attempt that ended, with a precondition on the
  version the decision saw, off the decision path (a low-priority slot);
- ``revoke``: the claim marked revoked (cancel, deadline) on its Lease, which its
  holder's sidecar watches.

Every reply is recorded in the store like a watch event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from agentq import claims, protocol, views
from agentq.clock import Clock, micro_rfc3339
from agentq.operator.gate import RequestGate
from agentq.operator.port import Body, Kube, KubeError, Status
from agentq.operator.store import Store
from agentq.operator.work import REFUSED_SECONDS, Agenda, Retries, Stats
from agentq.views import Key, LeaseView, TaskView

__all__ = ["ClaimLeases", "gone"]

log = logging.getLogger("agentq.controller")


class ClaimLeases:
    """Writes claim Leases (see the module docstring)."""

    def __init__(
        self,
        *,
        store: Store,
        agenda: Agenda,
        gate: RequestGate,
        kube: Kube,
        clock: Clock,
        retries: Retries,
        stats: Stats,
    ) -> None:
        self.store = store
        self.agenda = agenda
        self.gate = gate
        self.kube = kube
        self.clock = clock
        self.retries = retries
        self.stats = stats

    def observe(self, body: Body, *, deleted: bool = False) -> None:
        self.store.observe_lease(body, deleted=deleted, now=self.clock.monotonic(), wall_age=0.0)
        self.agenda.poke()

    async def delete(self, key: Key, lease: LeaseView) -> None:
        """Delete the Lease of an attempt that ended -- the one the decision saw: if it
        changed since (a new grant replaced it), the delete is refused (409) and the
        Lease stays. It tells a holder that is still alive at once that it lost the
        claim; nothing else waits on it, so it goes out after the decisions' requests."""
        record = self.store.leases.get(lease.key)
        if record is None or record.deleting:
            return
        record.deleting = True
        try:
            reply = await self.gate.call_low(
                self.kube.delete_lease, lease.namespace, lease.name, lease.resource_version
            )
        except KubeError as err:
            log.info("deleting Lease %s/%s had an unknown outcome: %s", *lease.key, err)
            self.retries.later(key)  # decide again
            return
        finally:
            record.deleting = False
        if reply.ok or reply.status is Status.GONE:
            self.observe(gone(lease), deleted=True)
        elif reply.status is Status.CONFLICT:
            # Changed since the decision (the holder's last renewal, say): its event found
            # this delete in flight and decided nothing. Decided again a moment later, on
            # the newer version: a finished task's Lease is never left behind (nor, with
            # it, the task's record and its TTL).
            self.retries.later(key)
        elif reply.status is Status.FORBIDDEN:
            self.stats.refused += 1
            log.error("deleting Lease %s/%s refused: %s", *lease.key, reply.message)
            self.retries.later(key, REFUSED_SECONDS)

    async def check_orphan(self, task: Key, lease: LeaseView) -> None:
        """A claim Lease in another namespace (no owner reference) whose task the store
        does not hold: read the task once; gone, or another object of that name (its UID),
        and the Lease is deleted. Off the decision path (a low-priority slot)."""
        try:
            reply = await self.gate.call_low(self.kube.get_task, *task)
        except KubeError as err:
            log.info("reading task %s/%s for its Lease had no answer: %s", *task, err)
            return
        if reply.status is Status.GONE:
            orphan = True
        elif reply.ok and reply.body is not None:
            uid = (reply.body.get("metadata") or {}).get("uid")
            orphan = bool(lease.task_uid) and uid != lease.task_uid
        else:
            record = self.store.leases.get(lease.key)
            if record is not None and reply.status is Status.FORBIDDEN:
                # Not ours to judge (a namespace we may not read): not asked again at
                # every resync, only once the Lease changes.
                record.unjudged = lease.resource_version
            return
        if orphan and task not in self.store.tasks:
            log.info("deleting Lease %s/%s: its task %s/%s is gone", *lease.key, *task)
            await self.delete(task, lease)

    async def revoke(self, task: TaskView, lease: LeaseView, reason: str) -> None:
        """Mark the claim revoked on its Lease (a CAS on the version the decision saw): the
        holder's sidecar stops renewing it and tells its agent ``reason``. A Lease that
        changed meanwhile (a report came) is decided again from its new version; one that
        went is decided again by its deletion."""
        patch = {"metadata": {"annotations": {protocol.ANNOTATION_REVOKED: reason}}}
        await self._patch(task, lease, patch, "revoking", on_invalid=self._revoke_refused)

    def _revoke_refused(self, task: TaskView, message: str) -> None:
        """The API server will never take the revoke mark on this Lease (422: its holder
        filled its annotations, say): decided again at once, the claim ends without it
        (``claims.Seen.revoke_refused``) -- else a holder that renews would keep it."""
        record = self.store.tasks.get(task.key)
        if record is None:
            return
        record.revoke_refused = (task.status.fencing_token or 0, message)
        self.retries.later(task.key, 0.0)

    async def _relabel(self, task: TaskView, lease: LeaseView, labels: dict[str, str]) -> None:
        """The claim's Lease is there but without our ``agentq.dev/lease`` label (someone
        with Lease rights took it off): the watch, which selects by it, no longer shows
        the Lease, and the claim would be judged never again. Its labels are put back
        (a CAS; nothing else of it changes), so the watch shows it again and the claim is
        judged as any other: renewed, reported on, expired, or tampered with."""
        log.warning(
            "the Lease %s/%s of %s lost its %s label; putting it back",
            lease.namespace,
            lease.name,
            task.name,
            protocol.LABEL_LEASE_KIND,
        )
        unanswered = await self._patch(task, lease, {"metadata": {"labels": labels}}, "relabelling")
        if unanswered is not None:
            # Gone meanwhile (or another answer): the watch does not show an unlabelled
            # Lease going, so nothing else would decide the task again.
            self.retries.later(task.key)

    async def _patch(
        self,
        task: TaskView,
        lease: LeaseView,
        patch: Body,
        doing: str,
        *,
        on_invalid: Callable[[TaskView, str], None] | None = None,
    ) -> Status | None:
        """A CAS patch of the claim's Lease on the version the decision saw, and what
        follows from the answer; returns the status of an answer not handled here (GONE,
        say), else None."""
        reply = await self.gate.call(
            self.kube.patch_lease, lease.namespace, lease.name, lease.resource_version, patch
        )
        if reply.ok and reply.body is not None:
            self.observe(reply.body)
        elif reply.status is Status.FORBIDDEN:
            self.stats.refused += 1
            log.error("%s Lease %s/%s forbidden: %s", doing, *lease.key, reply.message)
            self.retries.later(task.key, REFUSED_SECONDS)
        elif reply.status is Status.INVALID:
            log.error("%s Lease %s/%s refused: %s", doing, *lease.key, reply.message)
            if on_invalid is not None:
                on_invalid(task, reply.message)
            else:
                self.retries.left_alone(task.key)
        elif reply.status is Status.CONFLICT:
            # The Lease changed first -- most often a renewal, which is no decision of its
            # own (``renews``): decided again a moment later, on its newer version.
            self.retries.later(task.key)
        else:
            return reply.status
        return None

    def grant_lease_body(self, task: TaskView) -> Body:
        """The claim's Lease: in the task's namespace, owned by the task; or -- its worker
        in another namespace (``status.workerNamespace``) -- ``agentq-xtask-<namespace>.
        <task>`` in the worker's, labelled with the task's namespace and owned by nothing
        (an owner reference cannot cross namespaces: the operator deletes it)."""
        status = task.status
        now = micro_rfc3339(self.clock.now())
        worker = str(status.worker)
        cross = status.worker_namespace not in (None, task.namespace)
        labels = {
            protocol.LABEL_LEASE_KIND: protocol.LEASE_KIND_TASK,
            protocol.LABEL_TASK: protocol.label_value(task.name),
            protocol.LABEL_WORKER: protocol.label_value(worker),
        }
        if cross:
            labels[protocol.LABEL_TASK_NAMESPACE] = task.namespace
        metadata: Body = {
            "name": (
                protocol.cross_task_lease_name(task.namespace, task.name)
                if cross
                else protocol.task_lease_name(task.name)
            ),
            "namespace": status.worker_namespace if cross else task.namespace,
            "labels": labels,
            "annotations": {
                protocol.ANNOTATION_TOKEN: str(status.fencing_token),
                protocol.ANNOTATION_ATTEMPT: str(status.attempt or 1),
                protocol.ANNOTATION_TASK_UID: task.uid,
            },
        }
        if not cross:
            metadata["ownerReferences"] = [
                {
                    "apiVersion": "agentq.dev/v1alpha1",
                    "kind": "AgentTask",
                    "name": task.name,
                    "uid": task.uid,
                    "controller": True,
                    "blockOwnerDeletion": False,
                }
            ]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
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
        A Lease the API server refuses for good leaves the task alone for a while.
        """
        body = self.grant_lease_body(task)
        name = body["metadata"]["name"]
        namespace = body["metadata"]["namespace"]
        token = task.status.fencing_token or 0
        for _ in range(4):
            if lease is None:
                body["metadata"].pop("resourceVersion", None)  # a create carries none
                reply = await self.gate.call(self.kube.create_lease, namespace, body)
                if reply.status is Status.CONFLICT:
                    got = await self.gate.call(self.kube.get_lease, namespace, name)
                    if got.ok and got.body is not None:
                        self.observe(got.body)
                        lease = views.lease_view(got.body)
                    continue
            else:
                foreign = claims.lease_foreign(task, lease)
                if not foreign and lease.token is not None and lease.token >= token:
                    if lease.kind != protocol.LEASE_KIND_TASK:
                        await self._relabel(task, lease, body["metadata"]["labels"])
                    return
                body["metadata"]["resourceVersion"] = lease.resource_version
                reply = await self.gate.call(self.kube.replace_lease, namespace, name, body)
                if reply.status in (Status.CONFLICT, Status.GONE):
                    lease = None
                    continue
            if reply.ok and reply.body is not None:
                self.observe(reply.body)
                record = self.store.tasks.get(task.key)
                if record is not None:
                    record.lease_unwritable = None
            elif reply.status in (Status.FORBIDDEN, Status.INVALID) or (
                namespace != task.namespace and reply.status is Status.GONE
            ):
                # Refused for good (an admission policy, RBAC, a terminating or missing
                # namespace, a body the API server will not take): tried again now and
                # then, and the attempt ends once that lasted its lease duration -- the
                # claim holds a worker's slot and nothing else would end it.
                self._unwritable(task, namespace, reply.status, reply.message)
            return
        self.retries.later(task.key)  # the Lease kept changing under us: decide again

    def _unwritable(self, task: TaskView, namespace: str, status: Status, message: str) -> None:
        """The grant's Lease cannot be written in the worker's namespace: it is gone (a
        create's 404), terminating or refuses us (403, or 422 for the body). Tried again
        now and then; once that lasted the claim's lease duration from the first refusal,
        the decision fails the attempt as an expired claim
        (``claims.Seen.lease_unwritable``): with no Lease there is nothing else to expire,
        and the task would wait forever."""
        record = self.store.tasks.get(task.key)
        if record is None:
            return
        token = task.status.fencing_token or 0
        now = self.clock.monotonic()
        why = (
            f"namespace {namespace} is not found"
            if status is Status.GONE
            else f"refused in namespace {namespace}: {message}"
        )
        since = now
        if record.lease_unwritable is not None and record.lease_unwritable[0] == token:
            since = record.lease_unwritable[1]
        else:
            self.stats.refused += 1
            log.error("grant Lease of %s/%s cannot be written: %s", *task.key, why)
        record.lease_unwritable = (token, since, why)
        due = since + task.spec.lease_duration_seconds
        self.retries.later(task.key, max(0.0, min(REFUSED_SECONDS, due - now)))


def gone(lease: LeaseView) -> Body:
    return {
        "metadata": {
            "namespace": lease.namespace,
            "name": lease.name,
            "resourceVersion": lease.resource_version,
        }
    }
