"""Leader election on a ``coordination.k8s.io/v1`` Lease, after client-go's leaderelection.

Only the leader decides; every replica watches, so a new leader has warm
caches. As in client-go:

- the record's timestamps, written by the other replica's clock, are not
  trusted: a held lease is taken over only after ``lease_seconds`` pass on *our*
  monotonic clock without the record changing (``agentq.expiry``);
- a leader that has not renewed for ``renew_deadline`` stops deciding, and the
  deadline is below the lease duration (``OperatorConfig.check``), so it stops
  before anyone else may start; ``valid()`` lets the controller check it before
  every step and again as each decision's write is about to be sent
  (``Controller.call``): a process stopped for longer than that must neither decide
  a single step nor send a decision it made before the stop when it resumes;
- every round has a timeout (a hung request is a failed round, not a hang);
- ``remaining()`` is how long we may still act (the renew deadline less the time
  since the last renewal): the request gate bounds each decision's request by it,
  so no request of ours is still waiting after our lease could have passed on;
- every acquisition by a replica that was not leading raises the Lease's
  ``leaseTransitions`` (client-go's semantics: a takeover, and a re-acquisition after
  we stopped leading by our own clock, both count); the value written is our
  ``epoch``, which every grant carries (``status.leaderEpoch``) so that the admission
  policy ``agentq-leader-epoch`` refuses a grant of a deposed leader that reaches the
  API server late (manifests/leader-epoch-policy.yaml);
- losing leadership cancels the writes in flight (``on_change(False)``);
- a clean shutdown releases the Lease (holder cleared, as ReleaseOnCancel) so
  the standby takes over at its next retry instead of a whole lease later.

The pure part -- may we take or keep the Lease given what we saw -- is
``agentq.claims``-style arithmetic on the tracker; the I/O goes through the
``Kube`` port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from agentq.clock import Clock, micro_rfc3339
from agentq.expiry import LeaseRecord, LeaseTracker
from agentq.operator import metrics
from agentq.operator.port import Kube, KubeError, Reply, Status

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
        renew_deadline: float,
        retry_seconds: float,
        on_change: Callable[[bool], None],
    ) -> None:
        if not retry_seconds < renew_deadline < lease_seconds:
            raise ValueError(
                f"leader election needs retry ({retry_seconds}s) < renew deadline "
                f"({renew_deadline}s) < lease ({lease_seconds}s)"
            )
        self.kube = kube
        self.clock = clock
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_seconds = lease_seconds
        self.renew_deadline = renew_deadline
        self.retry_seconds = retry_seconds
        self.on_change = on_change
        self.tracker = LeaseTracker()
        self.leading = False
        self._last_renewed = -1e18
        self.other_holder: str | None = None
        # The Lease's leaseTransitions as our last successful round wrote it: the epoch
        # of our leadership (None before we ever held the Lease).
        self.epoch: int | None = None
        # A leaseTransitions the admission policy compared our grants with that is above
        # the Lease's own while we held it: its parameter cache is stale (see
        # ``epoch_refused``); our next renewal raises the Lease's leaseTransitions to it.
        self._epoch_floor = 0

    def valid(self) -> bool:
        """Still leading by our own clock: renewed within the renew deadline."""
        return self.remaining() > 0

    def remaining(self) -> float:
        """Seconds we may still act as the leader by our own clock (0 when not leading):
        the renew deadline less the time since the start of the last successful round."""
        if not self.leading:
            return 0.0
        return max(0.0, self.renew_deadline - (self.clock.monotonic() - self._last_renewed))

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
        got = await self.kube.get_lease(self.namespace, self.name)
        if not got.ok or got.body is None:
            if got.status is not Status.GONE:
                self._refused(got)
                return False
            created = await self.kube.create_lease(
                self.namespace,
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {
                        "holderIdentity": self.identity,
                        "leaseDurationSeconds": int(self.lease_seconds),
                        "acquireTime": now,
                        "renewTime": now,
                        "leaseTransitions": 0,
                    },
                },
            )
            self._refused(created)
            if created.ok:
                self.epoch = 0
            return created.ok
        lease = got.body
        spec: dict[str, Any] = lease.setdefault("spec", {})
        holder = spec.get("holderIdentity") or None
        record = LeaseRecord(
            holder=holder,
            renew_time=str(spec.get("renewTime")),
            duration=float(spec.get("leaseDurationSeconds") or self.lease_seconds),
        )
        self.tracker.observe(self.name, record, now_mono)
        held_by_other = holder is not None and holder != self.identity
        self.other_holder = holder if held_by_other else None
        if held_by_other and not self.tracker.expired(self.name, now_mono):
            return False
        if holder != self.identity or not self.leading:
            # A takeover, or ours again after we stopped leading by our own clock (our
            # writes were cancelled, some may still land): a new epoch either way, so
            # nothing sent under the old one can be taken for ours now.
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        elif self._epoch_floor > int(spec.get("leaseTransitions") or 0):
            # Ours all along, yet the policy read a higher leaseTransitions: a stale
            # parameter (see epoch_refused). Take that epoch.
            log.error(
                "the admission policy agentq-leader-epoch compares grants with "
                "leaseTransitions %s, but %s/%s, held by us, says %s: the API server's "
                "policy parameter is stale (kubernetes/kubernetes#130887, after a binding "
                "was deleted and made again); raising the Lease's leaseTransitions to %s so "
                "grants pass. Until the API server restarts, the policy does not fence a "
                "deposed leader (docs/operator.md, 'A stale policy parameter')",
                self._epoch_floor,
                self.namespace,
                self.name,
                spec.get("leaseTransitions") or 0,
                self._epoch_floor,
            )
            metrics.LEADER_EPOCH_POLICY_STALE.set(1)
            spec["leaseTransitions"] = self._epoch_floor
        spec["holderIdentity"] = self.identity
        spec["renewTime"] = now
        spec["leaseDurationSeconds"] = int(self.lease_seconds)
        replaced = await self.kube.replace_lease(self.namespace, self.name, lease)
        self._refused(replaced)
        if replaced.ok:
            self.epoch = int(spec["leaseTransitions"] or 0)
        return replaced.ok

    def epoch_refused(self, policy_epoch: int) -> None:
        """The policy ``agentq-leader-epoch`` refused a grant of ours as older than
        ``policy_epoch``, the leaseTransitions it reads. Above the epoch we hold the Lease
        with, it is either a takeover (our next round sees another holder and we stop
        leading) or a stale parameter: an API server whose policy binding was deleted and
        made again (an uninstall and a new install) keeps the Lease it read before for
        good (kubernetes/kubernetes#130887; restarted, it reads the Lease again). The
        Lease's holder tells them apart at our next round; for a stale parameter we take
        that epoch (the Lease's leaseTransitions raised to it: a new epoch, as a takeover
        would) so that grants pass again, and say that the policy no longer fences."""
        self._epoch_floor = max(self._epoch_floor, policy_epoch)

    def _refused(self, reply: Reply) -> None:
        # A refusal for who we are (RBAC, credentials) never cures itself: say so, each round.
        if reply.status is Status.FORBIDDEN:
            log.warning(
                "leader election refused on %s/%s: %s", self.namespace, self.name, reply.message
            )

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                started = self.clock.monotonic()
                try:
                    # As client-go's renew loop: a slow API server may take up to the renew
                    # deadline; past it the leader has stopped deciding anyway.
                    ok = await asyncio.wait_for(
                        self.try_acquire_or_renew(), timeout=self.renew_deadline
                    )
                except (TimeoutError, KubeError) as err:  # the API server is away or slow
                    log.warning("leader election round failed: %s", str(err) or type(err).__name__)
                    ok = False
                now = self.clock.monotonic()
                if ok and not stop.is_set():
                    self._last_renewed = started
                    self._set(True)
                elif self.leading and (
                    self.other_holder is not None or now - self._last_renewed >= self.renew_deadline
                ):
                    self._set(False)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.retry_seconds)
        finally:
            if self.leading:
                self._set(False)
                await self.release()

    async def release(self) -> None:
        """Give the Lease up (holder cleared) so the standby need not wait it out."""
        try:
            got = await asyncio.wait_for(
                self.kube.get_lease(self.namespace, self.name), timeout=self.retry_seconds
            )
            if got.ok and got.body is not None:
                spec = got.body.setdefault("spec", {})
                if spec.get("holderIdentity") == self.identity:
                    spec["holderIdentity"] = None
                    spec["leaseDurationSeconds"] = 1
                    await asyncio.wait_for(
                        self.kube.replace_lease(self.namespace, self.name, got.body),
                        timeout=self.retry_seconds,
                    )
                    log.info("%s released leadership", self.identity)
        except (TimeoutError, KubeError) as err:
            log.warning("could not release leadership: %s", err)
