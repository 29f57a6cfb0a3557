"""Leader election on a ``coordination.k8s.io/v1`` Lease, after client-go's leaderelection.

Only the leader runs the controller passes; every replica watches, so a new
leader has a warm store. As in client-go, the record's timestamps written by
the other replica's clock are not trusted: a held lease is taken over only
after ``lease_seconds`` pass on *our* monotonic clock without the record
changing (``agentq.expiry``). A leader that cannot renew within
``renew_seconds`` stops leading before anyone else may start; on a clean
shutdown it releases the lease (holder cleared) so the standby takes over at
its next retry instead of waiting a whole lease duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from kubernetes import client

from agentq.clock import Clock, micro_rfc3339
from agentq.expiry import LeaseRecord, LeaseTracker
from agentq.operator.kube import Kube

log = logging.getLogger("agentq.leader")


class LeaderElector:
    def __init__(
        self,
        *,
        kube: Kube,
        clock: Clock,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: float,
        renew_seconds: float,
        retry_seconds: float,
        on_change: Callable[[bool], None],
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        self.retry_seconds = retry_seconds
        self.on_change = on_change
        self.tracker = LeaseTracker()
        self.leading = False
        self._last_renewed = 0.0
        self.other_holder: str | None = None

    def _set(self, leading: bool) -> None:
        if leading != self.leading:
            log.info(
                "%s %s leadership of %s/%s",
                self.identity,
                "acquired" if leading else "lost",
                self.namespace,
                self.name,
            )
            self.leading = leading
            self.on_change(leading)

    async def try_acquire_or_renew(self) -> bool:
        """One round: True if we hold the lease afterwards."""
        now_mono = self.clock.monotonic()
        now = micro_rfc3339(self.clock.now())
        lease = await self.kube.read_lease(self.namespace, self.name)
        if lease is None:
            created = await self.kube.create_lease(
                self.namespace,
                client.V1Lease(
                    metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                    spec=client.V1LeaseSpec(
                        holder_identity=self.identity,
                        lease_duration_seconds=int(self.lease_seconds),
                        acquire_time=now,
                        renew_time=now,
                        lease_transitions=0,
                    ),
                ),
            )
            return created is not None
        spec = lease.spec
        record = LeaseRecord(
            holder=spec.holder_identity,
            renew_time=str(spec.renew_time),
            duration=float(spec.lease_duration_seconds or self.lease_seconds),
        )
        self.tracker.observe(self.name, record, now_mono)
        held_by_other = bool(spec.holder_identity) and spec.holder_identity != self.identity
        self.other_holder = spec.holder_identity if held_by_other else None
        if held_by_other and not self.tracker.expired(self.name, now_mono):
            return False
        if spec.holder_identity != self.identity:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.holder_identity = self.identity
        spec.renew_time = now
        spec.lease_duration_seconds = int(self.lease_seconds)
        return await self.kube.replace_lease(self.namespace, lease) is not None

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    ok = await self.try_acquire_or_renew()
                except Exception as err:  # the API server is away: treat as a failed round
                    log.warning("leader election round failed: %s", err)
                    ok = False
                now = self.clock.monotonic()
                if ok:
                    self._last_renewed = now
                    self._set(True)
                elif self.leading and (
                    self.other_holder is not None or now - self._last_renewed >= self.renew_seconds
                ):
                    self._set(False)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.retry_seconds)
        finally:
            if self.leading:
                self._set(False)
                await self._release()

    async def _release(self) -> None:
        try:
            lease = await self.kube.read_lease(self.namespace, self.name)
            if lease is not None and lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                await self.kube.replace_lease(self.namespace, lease)
        except Exception as err:
            log.warning("could not release leadership: %s", err)
