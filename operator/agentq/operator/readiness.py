"""Each AgentWorker's readiness, and its place in the scheduling core.

A worker is Ready only while its own worker Lease is fresh (judged on the
operator's clock, ``agentq.expiry``); when it is not, ``claims.readiness`` says
what is missing: no Lease, a Lease without the label the watch selects on (found
by a direct read, ``_diagnose``, at most every ``DIAGNOSE_SECONDS``), released,
stale, or a claim of it expired and its Lease was not renewed since (suspect).
A change of readiness is published at once and applied to the core (a worker
that is not ready earns no credit and gets no task). Every evaluation of a
worker whose Lease is fresh sets a timer for when it would go stale.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from agentq import claims, protocol
from agentq.claims import Readiness
from agentq.models import MIN_WEIGHT
from agentq.operator.cache import TIMER_WORKER, Key
from agentq.operator.port import KubeError
from agentq.scheduler import Assignment, Scheduler, WorkerSpec
from agentq.views import WorkerView

if TYPE_CHECKING:
    from agentq.operator.controller import Controller

log = logging.getLogger("agentq.controller")

DIAGNOSE_SECONDS = 30.0  # least time between two reads of a worker's unlabelled Lease


class WorkerReadiness:
    """Readiness per worker, and what it is judged from besides the Lease."""

    def __init__(self, controller: Controller) -> None:
        self.c = controller
        self.of: dict[Key, tuple[Readiness, str]] = {}
        self.suspect: dict[Key, float] = {}  # worker -> since (monotonic)
        self.unlabelled: dict[Key, tuple[bool, float]] = {}  # worker -> (found, when read)

    def reset(self) -> None:
        """This replica starts leading: a diagnosis it started before may have been
        cancelled with its writes, so every unlabelled Lease may be read again."""
        for key, (found, _) in list(self.unlabelled.items()):
            self.unlabelled[key] = (found, -math.inf)

    def forget(self, key: Key) -> None:
        for table in (self.of, self.suspect, self.unlabelled):
            table.pop(key, None)

    def expired_claim(self, key: Key, since: float) -> None:
        """A claim ``key`` held expired: no new task until its Lease is renewed again."""
        if key not in self.c.workers:
            return  # deleted while the expiry was being written: nothing to remember
        self.suspect.setdefault(key, since)
        self.evaluate(key)

    def evaluate(self, key: Key, *, spec_changed: bool = False) -> None:
        """Recompute a worker's readiness; tell the core and the publisher if it changed."""
        c = self.c
        worker = c.workers.get(key)
        if worker is None:
            return
        now = c.clock.monotonic()
        lease_key = (key[0], protocol.worker_lease_name(key[1]))
        lease = c.leases.get(lease_key)
        fresh = lease is not None and c.tracker.fresh(lease_key, now, lease.duration or 0)
        suspect_since = self.suspect.get(key)
        if suspect_since is not None and fresh:
            changed = c.tracker.last_change(lease_key)
            if changed is not None and changed > suspect_since:
                del self.suspect[key]
                suspect_since = None
        unlabelled = self.unlabelled.get(key, (False, 0.0))[0]
        ready = claims.readiness(
            worker, lease, fresh=fresh, unlabelled=unlabelled, suspect=suspect_since is not None
        )
        if ready[0] is Readiness.LEASE_MISSING:
            self._maybe_diagnose(key)
        expires = c.tracker.expires_at(lease_key) if lease is not None else None
        if expires is not None and expires > now:
            # Looked at again when it would go stale. Here, not where the Lease's event is
            # handled: the Lease may be seen before its worker (two watches), and a timer
            # set for neither left a worker whose sidecar died Ready for good.
            c.push_timer(expires, (TIMER_WORKER, key))
        if self.of.get(key) != ready or spec_changed:
            self.of[key] = ready
            c.publisher.mark(key, urgent=True)
            if c.leading:
                self.upsert(c.scheduler_for(key[0]), worker)

    def upsert(self, scheduler: Scheduler, worker: WorkerView) -> None:
        c = self.c
        if worker.spec is None:
            if scheduler.has_worker(worker.name):
                for task in scheduler.remove_worker(worker.name):
                    c.dirty.add((worker.namespace, task))
            return
        ready = self.of.get(worker.key, (Readiness.LEASE_MISSING, ""))[0]
        joined = not scheduler.has_worker(worker.name)
        weight = worker.spec.weight
        scheduler.upsert_worker(
            WorkerSpec(
                name=worker.name,
                capabilities=worker.spec.capabilities,
                weight=max(MIN_WEIGHT, weight) if math.isfinite(weight) else 1.0,
                max_in_flight=worker.spec.max_in_flight,
                paused=worker.spec.paused,
                # Paused workers keep their readiness (Draining); the core reads paused.
                ready=ready in (Readiness.READY, Readiness.PAUSED),
            )
        )
        if joined:
            served = worker.status.served_cost
            if served is not None and math.isfinite(served) and served >= 0:
                scheduler.carry_over_served(worker.name, served)
            # Claims the worker already holds (read back from the task statuses).
            for name in c.claims_of.get(worker.key, ()):
                held = c.tasks.get((worker.namespace, name))
                if held is not None and held.active:
                    scheduler.restore(
                        Assignment(task=name, worker=worker.name, cost=held.spec.cost)
                    )

    def _maybe_diagnose(self, key: Key) -> None:
        """The watch selects worker Leases by label, so a Lease without it is invisible:
        read it directly (at most every 30 s per worker) to say so in the condition."""
        c = self.c
        found, when = self.unlabelled.get(key, (False, -math.inf))
        now = c.clock.monotonic()
        if not c.leading:
            return
        if now - when < DIAGNOSE_SECONDS:
            # Read recently: read again when the interval is over. (The timer pushed with
            # that read may be gone: one live timer per worker, and an earlier one for its
            # Lease's expiry replaces it.)
            c.push_timer(when + DIAGNOSE_SECONDS, (TIMER_WORKER, key))
            return
        self.unlabelled[key] = (found, now)
        # Looked at again after the interval even if no event comes (the read may fail).
        c.push_timer(now + DIAGNOSE_SECONDS, (TIMER_WORKER, key))
        c.spawn(self._diagnose(key))

    async def _diagnose(self, key: Key) -> None:
        c = self.c
        try:
            reply = await c.call(c.kube.get_lease, key[0], protocol.worker_lease_name(key[1]))
        except KubeError as err:
            log.info("could not read the Lease of worker %s/%s: %s", *key, err)
            return
        found = reply.ok and reply.body is not None
        if found and reply.body is not None:
            labels = (reply.body.get("metadata") or {}).get("labels") or {}
            found = labels.get(protocol.LABEL_LEASE_KIND) != protocol.LEASE_KIND_WORKER
        self.unlabelled[key] = (found, c.clock.monotonic())
        log.info(
            "worker %s/%s: Lease %s %s",
            *key,
            protocol.worker_lease_name(key[1]),
            "exists without our label" if found else "is missing",
        )
        self.evaluate(key)
        c.poke()


__all__ = ["DIAGNOSE_SECONDS", "WorkerReadiness"]
