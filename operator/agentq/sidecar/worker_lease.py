"""Keeps the worker Lease ``agentq-worker-<worker>``: the worker's readiness, and the
lock that makes this sidecar the only one serving the worker's task Leases.

- Created with the labels the operator selects on (``agentq.dev/lease=worker``,
  ``agentq.dev/worker=<worker>``) and ``holderIdentity`` = this sidecar's identity
  (its pod name); a Lease of that name without those labels gets them on our write.
- Renewed every third of its duration with ONE request: a replace carrying the
  resourceVersion of our last write's response. On 409 it is read again once.
- Held by another identity: we wait, as client-go's leader election does, until we
  have seen its record unchanged for its whole duration on our monotonic clock (or
  it was released), then take it over with a compare-and-swap. Task Leases that
  exist at that moment are not ours to serve (``serve_from_rv``): the previous
  holder's agent may still be working on them with the same fencing token.
  Taking over from our own identity (a restarted sidecar container in the same
  pod) adopts them: the agent beside us is the same. So does taking back a Lease
  released by our own identity (``agentq.dev/released-by``): the container was
  stopped gracefully (a liveness-probe restart) rather than killed.
- ``held(now)``: our last successful write is younger than the Lease's duration.
  Task Leases are renewed only while this holds, so a sidecar that was frozen or
  cut off first proves it still holds the worker Lease before renewing anything.
- ``drain()`` when the pod goes away (its agent asks, ``POST /v1/drain``): the Lease
  is renewed at once annotated ``agentq.dev/draining=true``, and kept so; the
  operator then gives the worker no new task while its claims stay renewed, so the
  agent can finish them before it exits (a scale-down that loses no claim). A
  takeover or a new Lease never carries the annotation.
- ``release()`` on shutdown: a replace with ``holderIdentity`` cleared (and a
  one-second duration, as client-go's ReleaseOnCancel writes), so the operator
  stops dispatching to the worker at once, annotated ``agentq.dev/released-by`` =
  our identity (dropped by the next holder's first write), so that a restart in the
  same pod is told from another pod. The Lease stays (the next pod of the worker
  takes it over).
- ``own_by(agent_worker)`` once the sidecar has registered its AgentWorker: the
  Lease's next write names it its owner, so the garbage collector deletes the Lease
  with the worker (a pool's pod that owns it, the CRDs deleted after an uninstall,
  the namespace) instead of leaving it behind. A Lease deleted under us is made again
  without the owner: it may have been deleted because that owner went.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Callable
from typing import Any

from agentq import protocol
from agentq.clock import Clock, micro_rfc3339
from agentq.expiry import LeaseRecord, LeaseTracker
from agentq.kube import Backoff
from agentq.sidecar.attempts import slim
from agentq.sidecar.kubeapi import ApiError, KubeApi, lease_path

log = logging.getLogger("agentq.sidecar.worker_lease")

Body = dict[str, Any]


class WorkerLeaseKeeper:
    def __init__(
        self,
        api: KubeApi,
        clock: Clock,
        *,
        namespace: str,
        worker: str,
        identity: str,
        duration_seconds: int,
        on_acquired: Callable[[int], None],
        on_lost: Callable[[str], None],
        on_confirmed: Callable[[], None] = lambda: None,
    ) -> None:
        self.api = api
        self.clock = clock
        self.namespace = namespace
        self.worker = worker
        self.identity = identity
        self.duration = duration_seconds
        self.name = protocol.worker_lease_name(worker)
        self.on_acquired = on_acquired
        self.on_lost = on_lost
        # Called when a renewal makes ``held`` true again after it had lapsed (the renewal
        # loop waits for it instead of asking every few milliseconds).
        self.on_confirmed = on_confirmed
        self.lease: Body | None = None  # our last write's response
        self.confirmed_at: float | None = None  # when that write was sent (monotonic)
        self.holding = False
        self.serve_from_rv = 0
        self.other_holder: str | None = None
        # A takeover from another holder whose write had an unknown outcome: if it
        # happened, the next round finds us the holder, and that is still a takeover.
        self._taking_over = False
        self._tracker = LeaseTracker()
        self.renewals = 0
        self.draining = False
        self._renew_now = asyncio.Event()
        self.owner: Body | None = None  # an ownerReference to the worker's AgentWorker

    def own_by(self, owner: Body) -> None:
        """Make ``owner`` (an ownerReference to the registered AgentWorker) the Lease's
        owner at its next write, which is now."""
        if owner != self.owner:
            log.info("worker Lease %s: owned by AgentWorker uid %s", self.name, owner["uid"])
        self.owner = owner
        self._renew_now.set()

    # -- state --------------------------------------------------------------------------

    def held(self, now: float) -> bool:
        return (
            self.holding
            and self.confirmed_at is not None
            and now - self.confirmed_at < self.duration
        )

    def describe(self) -> str:
        if self.holding:
            return f"holding the worker Lease {self.namespace}/{self.name}"
        if self.other_holder:
            return (
                f"waiting for the worker Lease {self.namespace}/{self.name}, "
                f"held by {self.other_holder}, to be released or to expire"
            )
        return f"acquiring the worker Lease {self.namespace}/{self.name}"

    # -- the loop -----------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        backoff = Backoff(initial=0.2, maximum=max(0.5, self.duration / 3))
        while not stop.is_set():
            try:
                await self.step()
                backoff.reset()
                delay = self.duration / 3
            except ApiError as err:
                log.warning("worker Lease %s: %s", self.name, err)
                delay = backoff.next()
            except Exception:  # never let the keeper die: the pod would look alive but idle
                log.exception("worker Lease %s: unexpected error", self.name)
                delay = backoff.next()
            self._renew_now.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_first(stop, self._renew_now), timeout=delay)

    def drain(self) -> None:
        """Mark the worker draining: the next renewal (at once) carries the annotation."""
        if not self.draining:
            log.info("worker Lease %s: draining (no new task; claims kept)", self.name)
        self.draining = True
        self._renew_now.set()

    async def step(self) -> None:
        """One round: renew the Lease we hold, or try to acquire it."""
        if self.holding and self.lease is not None:
            await self._renew()
        else:
            await self._acquire()

    # -- acquiring -------------------------------------------------------------------------

    async def _acquire(self) -> None:
        now = self.clock.monotonic()
        try:
            current = await self.api.request(
                "GET", lease_path(self.namespace, self.name), resource="leases"
            )
        except ApiError as err:
            if err.status != 404:
                raise
            await self._create()
            return
        spec = current.get("spec") or {}
        holder = spec.get("holderIdentity")
        if holder and holder != self.identity:
            record = LeaseRecord(
                holder=holder,
                renew_time=str((current.get("metadata") or {}).get("resourceVersion")),
                duration=float(spec.get("leaseDurationSeconds") or self.duration),
            )
            self._tracker.observe(self.name, record, now)
            if not self._tracker.expired(self.name, now):
                if self.other_holder != holder:
                    log.info("worker Lease %s is held by %s; waiting", self.name, holder)
                self.other_holder = holder
                return
        # Ours: held by our identity (a crash), or released by it (a graceful stop).
        ours = holder == self.identity or (not holder and released_by(current) == self.identity)
        if not ours:
            serve_from = None  # a takeover: serve what is written after it
        elif self._taking_over:
            serve_from = _rv(current)  # our takeover did happen: this is its write
        else:
            serve_from = 0  # a restart in this pod: the agent beside us is the same
        await self._take(current, serve_from_rv=serve_from)

    async def _create(self) -> None:
        now = micro_rfc3339(self.clock.now())
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": self._owned(
                {"name": self.name, "namespace": self.namespace, "labels": self._labels()}
            ),
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.duration,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        sent = self.clock.monotonic()
        try:
            created = await self.api.request(
                "POST", lease_path(self.namespace), body=body, resource="leases"
            )
        except ApiError as err:
            if err.status == 409:
                return  # someone created it in between: the next round reads it
            raise
        self._acquired(created, sent, serve_from_rv=0)

    async def _take(self, current: Body, *, serve_from_rv: int | None) -> None:
        body = self._ours(current)
        now = micro_rfc3339(self.clock.now())
        spec = body.setdefault("spec", {})
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec["holderIdentity"] = self.identity
        spec["leaseDurationSeconds"] = self.duration
        spec["renewTime"] = now
        sent = self.clock.monotonic()
        try:
            written = await self.api.request(
                "PUT", lease_path(self.namespace, self.name), body=body, resource="leases"
            )
        except ApiError as err:
            if err.status in (404, 409):
                return  # changed or gone in between: the next round decides again
            if serve_from_rv is None:
                self._taking_over = True
            raise
        # Adopting our own (same pod): serve every task Lease. Otherwise only those
        # written after the takeover.
        serve_from = _rv(written) if serve_from_rv is None else serve_from_rv
        self._acquired(written, sent, serve_from_rv=serve_from)

    def _acquired(self, lease: Body, sent: float, *, serve_from_rv: int) -> None:
        self.lease = slim(lease)
        self.confirmed_at = sent
        self.holding = True
        self.other_holder = None
        self._taking_over = False
        self.serve_from_rv = serve_from_rv
        self._tracker.forget(self.name)
        log.info(
            "acquired worker Lease %s as %s (serving task Leases newer than rv %s)",
            self.name,
            self.identity,
            serve_from_rv,
        )
        self.on_acquired(serve_from_rv)

    # -- renewing ---------------------------------------------------------------------------

    async def _renew(self) -> None:
        assert self.lease is not None
        body = self._renewed(self.lease)
        sent = self.clock.monotonic()
        try:
            written = await self.api.request(
                "PUT", lease_path(self.namespace, self.name), body=body, resource="leases"
            )
        except ApiError as err:
            if err.status == 404:
                self._deleted()
                return
            if err.status != 409:
                raise
            again = await self._renew_after_conflict()
            if again is None:
                return
            written = again
        lapsed = not self.held(self.clock.monotonic())
        self.lease = slim(written)
        self.confirmed_at = sent
        self.renewals += 1
        if lapsed and self.held(self.clock.monotonic()):
            self.on_confirmed()

    async def _renew_after_conflict(self) -> Body | None:
        try:
            current = await self.api.request(
                "GET", lease_path(self.namespace, self.name), resource="leases"
            )
        except ApiError as err:
            if err.status == 404:
                self._deleted()
                return None
            raise
        holder = current_holder(current)
        if holder != self.identity:
            self._lose(f"the worker Lease is now held by {holder or 'nobody'}")
            return None
        written: Body = await self.api.request(
            "PUT",
            lease_path(self.namespace, self.name),
            body=self._renewed(current),
            resource="leases",
        )
        return written

    def _renewed(self, lease: Body) -> Body:
        body = self._ours(lease)
        spec = body.setdefault("spec", {})
        spec["holderIdentity"] = self.identity
        spec["leaseDurationSeconds"] = self.duration
        spec["renewTime"] = micro_rfc3339(self.clock.now())
        return body

    def _ours(self, lease: Body) -> Body:
        """A copy of ``lease`` to write back as ours: our labels, owner and draining mark
        (without the managed fields the API server keeps)."""
        body = copy.deepcopy(lease)
        body["metadata"].pop("managedFields", None)
        body["metadata"]["labels"] = {**(body["metadata"].get("labels") or {}), **self._labels()}
        self._owned(body["metadata"])
        self._mark_draining(body)
        # Held again: no longer released (by us or the pod we take it over from).
        body["metadata"]["annotations"].pop(protocol.ANNOTATION_RELEASED_BY, None)
        return body

    def _deleted(self) -> None:
        # Perhaps by the garbage collector, its owner gone: made again, it is not owned.
        self.owner = None
        self._lose("the worker Lease was deleted")

    def _lose(self, reason: str) -> None:
        if self.holding:
            log.warning("lost worker Lease %s: %s", self.name, reason)
        self.holding = False
        self.lease = None
        self.confirmed_at = None
        self.on_lost(reason)

    # -- releasing --------------------------------------------------------------------------

    async def release(self) -> bool:
        """Clear ``holderIdentity`` if we hold the Lease, saying who released it; True if
        released."""
        if not self.holding or self.lease is None:
            return False
        self.holding = False
        path = lease_path(self.namespace, self.name)
        try:
            await self.api.request("PUT", path, body=self._released(self.lease), resource="leases")
        except ApiError as err:
            if err.status != 409:
                log.warning("could not release worker Lease %s: %s", self.name, err)
                return False
            current = await self.api.request("GET", path, resource="leases")
            if current_holder(current) != self.identity:
                return False
            await self.api.request("PUT", path, body=self._released(current), resource="leases")
        log.info("released worker Lease %s", self.name)
        return True

    def _released(self, lease: Body) -> Body:
        """A copy of ``lease`` released: no holder (the operator sees the worker go at
        once), a one-second duration, and our identity as the one that released it (a
        restart in this pod takes the Lease back as its own)."""
        body = copy.deepcopy(lease)
        body["metadata"].pop("managedFields", None)
        body["metadata"]["annotations"] = {
            **(body["metadata"].get("annotations") or {}),
            protocol.ANNOTATION_RELEASED_BY: self.identity,
        }
        spec = body.setdefault("spec", {})
        spec["holderIdentity"] = None
        spec["leaseDurationSeconds"] = 1
        spec["renewTime"] = micro_rfc3339(self.clock.now())
        return body

    def _mark_draining(self, body: Body) -> None:
        annotations = dict(body["metadata"].get("annotations") or {})
        if self.draining:
            annotations[protocol.ANNOTATION_DRAINING] = "true"
        else:
            annotations.pop(protocol.ANNOTATION_DRAINING, None)
        body["metadata"]["annotations"] = annotations

    def _owned(self, metadata: Body) -> Body:
        """``metadata`` with our AgentWorker among its owners (in place of any other
        AgentWorker: one of an earlier registration), once we know it."""
        if self.owner is not None:
            others = [
                ref
                for ref in metadata.get("ownerReferences") or []
                if ref.get("kind") != "AgentWorker"
            ]
            metadata["ownerReferences"] = [*others, self.owner]
        return metadata

    def _labels(self) -> dict[str, str]:
        return {
            protocol.LABEL_LEASE_KIND: "worker",
            protocol.LABEL_WORKER: protocol.label_value(self.worker),
        }


async def _first(*events: asyncio.Event) -> None:
    """Return when any of ``events`` is set."""
    waits = [asyncio.create_task(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


def current_holder(lease: Body) -> str | None:
    holder = (lease.get("spec") or {}).get("holderIdentity")
    return str(holder) if holder else None


def released_by(lease: Body) -> str | None:
    """The identity that released ``lease`` (``release``), if it is released."""
    annotations = (lease.get("metadata") or {}).get("annotations") or {}
    by = annotations.get(protocol.ANNOTATION_RELEASED_BY)
    return str(by) if by else None


def _rv(body: Body) -> int:
    try:
        return int(str((body.get("metadata") or {}).get("resourceVersion")))
    except ValueError:
        return 0
