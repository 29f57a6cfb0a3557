"""Leader election by hand, for the unit tests of the leader's epoch and fencing: a
``LeaderElector`` on the harness's in-memory API server and fake clock, and one election
round at a time, as ``LeaderElector.run`` does it."""

from __future__ import annotations

from agentq.operator.controller import Controller
from agentq.operator.leader import LeaderElector
from harness import NS, Harness

LEASE_SECONDS = 4.0
RENEW_DEADLINE = 2.5


def elector(h: Harness, identity: str, controller: Controller | None = None) -> LeaderElector:
    """An elector for ``identity``; with a ``controller``, it tells it whether it leads
    and whether the lease is still valid, as the operator wires them."""
    e = LeaderElector(
        kube=h.kube,
        clock=h.clock,
        namespace=NS,
        name="agentq-operator",
        identity=identity,
        lease_seconds=LEASE_SECONDS,
        renew_deadline=RENEW_DEADLINE,
        retry_seconds=1.0,
        on_change=(lambda leading: None) if controller is None else controller.set_leading,
    )
    if controller is not None:
        controller.lease_valid = e.valid
    return e


async def round_of(e: LeaderElector) -> bool:
    """One election round as ``LeaderElector.run`` does it."""
    started = e.clock.monotonic()
    ok = await e.try_acquire_or_renew()
    if ok:
        e._last_renewed = started
        e._set(True)
    elif e.leading and (
        e.other_holder is not None or e.clock.monotonic() - e._last_renewed >= e.renew_deadline
    ):
        e._set(False)
    return ok
