"""Each AgentWorker's readiness, judged in the step from its record and its worker Lease.

A worker is Ready only while its own worker Lease is fresh (judged on the
operator's clock, ``agentq.expiry``); when it is not, ``claims.readiness`` says
what is missing: no Lease, a Lease without the label the watch selects on (found
by a direct read, at most every ``DIAGNOSE_SECONDS``), released, stale, or a
claim of it expired and its Lease was not renewed since (suspect). A change of
readiness is published at once and applied to the core (a worker that is not
ready earns no credit and gets no task). Every evaluation of a worker whose
Lease is fresh sets a timer for when it would go stale.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from agentq import claims, protocol
from agentq.claims import Readiness
from agentq.clock import Clock
from agentq.operator.cores import Cores
from agentq.operator.gate import RequestGate
from agentq.operator.port import Kube, KubeError
from agentq.operator.publish import Publisher
from agentq.operator.store import Store
from agentq.operator.work import TIMER_WORKER, Agenda
from agentq.views import Key

__all__ = ["DIAGNOSE_SECONDS", "WorkerReadiness"]

log = logging.getLogger("agentq.controller")

DIAGNOSE_SECONDS = 30.0  # least time between two reads of a worker's unlabelled Lease


class WorkerReadiness:
    """Evaluates workers' readiness (see the module docstring)."""

    def __init__(
        self,
        *,
        store: Store,
        cores: Cores,
        agenda: Agenda,
        gate: RequestGate,
        kube: Kube,
        clock: Clock,
        publisher: Publisher,
        redecide: Callable[[list[Key]], None],
    ) -> None:
        self.store = store
        self.cores = cores
        self.agenda = agenda
        self.gate = gate
        self.kube = kube
        self.clock = clock
        self.publisher = publisher
        self.redecide = redecide  # tasks a worker held when it left the core

    def evaluate(self, key: Key) -> None:
        """Recompute a worker's readiness; tell the core and the publisher if it changed."""
        record = self.store.workers.get(key)
        if record is None:
            return
        now = self.clock.monotonic()
        lease = self.store.worker_lease(key)
        fresh = lease is not None and lease.seen.fresh(now, lease.view.duration or 0)
        if record.suspect_since is not None and fresh:
            assert lease is not None
            if lease.seen.changed_at > record.suspect_since:
                record.suspect_since = None
        ready = claims.readiness(
            record.view,
            lease.view if lease is not None else None,
            fresh=fresh,
            unlabelled=record.unlabelled,
            suspect=record.suspect_since is not None,
        )
        if ready[0] is Readiness.LEASE_MISSING:
            self._maybe_diagnose(key)
        if lease is not None:
            expires = lease.seen.expires_at()
            if expires > now:
                # Looked at again when it would go stale. Here, not where the Lease's event
                # is handled: the Lease may be seen before its worker (two watches).
                self.agenda.at(expires, (TIMER_WORKER, key))
        if record.readiness != ready:
            record.readiness = ready
            self.publisher.mark(key, urgent=True)
        # The core ignores an unchanged spec: a changed spec (capabilities, weight) or
        # readiness is applied, whichever changed.
        released = self.cores.upsert_worker(key, record)
        if released:  # it left the core: its claims are decided again
            self.redecide(released)

    def expired_claim(self, key: Key, since: float) -> None:
        """A claim ``key`` held expired: no new task until its Lease is renewed again.
        Recorded; the step evaluates the worker."""
        record = self.store.workers.get(key)
        if record is None:
            return  # deleted while the expiry was being written: nothing to remember
        if record.suspect_since is None:
            record.suspect_since = since
        self.store.changed.workers[key] = None
        self.agenda.poke()

    def _maybe_diagnose(self, key: Key) -> None:
        """The watch selects worker Leases by label, so a Lease without it is invisible:
        read it directly (at most every 30 s per worker) to say so in the condition."""
        record = self.store.workers[key]
        now = self.clock.monotonic()
        if now - record.diagnosed_at < DIAGNOSE_SECONDS:
            # Read recently: read again when the interval is over.
            self.agenda.at(record.diagnosed_at + DIAGNOSE_SECONDS, (TIMER_WORKER, key))
            return
        record.diagnosed_at = now
        # Looked at again after the interval even if no event comes (the read may fail).
        self.agenda.at(now + DIAGNOSE_SECONDS, (TIMER_WORKER, key))
        self.gate.spawn(self._diagnose(key))

    async def _diagnose(self, key: Key) -> None:
        try:
            reply = await self.gate.call(
                self.kube.get_lease, key[0], protocol.worker_lease_name(key[1])
            )
        except KubeError as err:
            log.info("could not read the Lease of worker %s/%s: %s", *key, err)
            return
        found = reply.ok and reply.body is not None
        if found and reply.body is not None:
            labels = (reply.body.get("metadata") or {}).get("labels") or {}
            found = labels.get(protocol.LABEL_LEASE_KIND) != protocol.LEASE_KIND_WORKER
        log.info(
            "worker %s/%s: Lease %s %s",
            *key,
            protocol.worker_lease_name(key[1]),
            "exists without our label" if found else "is missing",
        )
        record = self.store.workers.get(key)
        if record is not None:
            record.unlabelled = found
            self.store.changed.workers[key] = None  # the step evaluates it again
            self.agenda.poke()
