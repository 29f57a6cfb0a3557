"""The leader fences itself (docs/operator.md, "Fencing the leader itself").

- Each decision's request is given at most ``min(request timeout, the leader's
  remaining validity)``: the request gate cuts it there (outcome unknown), and sends
  nothing once the validity is spent.
- ``OperatorConfig.check`` refuses a request timeout that outlasts the leader lease.
- Every acquisition by a replica that was not leading raises the election Lease's
  ``leaseTransitions`` (client-go's semantics); the value is the replica's epoch, and
  every grant carries it in ``status.leaderEpoch`` for the admission policy
  ``agentq-leader-epoch`` (tested on the real API server in
  tests/integration/test_leader_epoch_fence.py).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import pytest
from elections import LEASE_SECONDS, RENEW_DEADLINE, elector, round_of
from prometheus_client import REGISTRY

from agentq.clock import FakeClock
from agentq.operator.config import OperatorConfig
from agentq.operator.gate import RequestGate
from agentq.operator.port import KubeError, NotLeading, Reply, Status
from agentq.operator.slots import Slots
from builders import task
from harness import NS, Harness, run


def gate(*, timeout: float, remaining: float) -> RequestGate:
    return RequestGate(
        Slots(2, clock=FakeClock()),
        may_send=lambda: True,
        on_done=lambda: None,
        timeout=timeout,
        remaining=lambda: remaining,
    )


async def hang() -> Reply:
    await asyncio.sleep(3600)
    raise AssertionError("not cut")


async def answer() -> Reply:
    return Reply(Status.OK, {}, "")


@run
async def test_a_decision_request_is_cut_at_what_is_left_of_the_leader_lease() -> None:
    started = time.monotonic()
    with pytest.raises(KubeError, match=r"no answer within 0\.20s"):
        await gate(timeout=10.0, remaining=0.2).call(hang)
    assert time.monotonic() - started < 2.0  # not the 10 s request timeout


@run
async def test_a_decision_request_is_cut_at_the_request_timeout_when_the_lease_has_longer() -> None:
    with pytest.raises(KubeError, match=r"no answer within 0\.10s"):
        await gate(timeout=0.1, remaining=9.0).call(hang)
    assert (await gate(timeout=0.1, remaining=9.0).call(answer)).ok


@run
async def test_nothing_is_sent_once_the_leader_lease_is_spent() -> None:
    sent: list[str] = []

    async def send() -> Reply:
        sent.append("x")
        return Reply(Status.OK, {}, "")

    with pytest.raises(NotLeading):
        await gate(timeout=10.0, remaining=0.0).call(send)
    assert sent == []


@run
async def test_an_expiry_confirmation_is_cut_too() -> None:
    g = gate(timeout=10.0, remaining=0.1)
    with pytest.raises(KubeError):
        async with g.sending("confirming expiries"):
            await asyncio.sleep(3600)


def test_check_refuses_a_request_timeout_that_outlasts_the_leader_lease() -> None:
    config = OperatorConfig(leader_lease_seconds=15, request_timeout=15)
    with pytest.raises(ValueError, match=r"AGENTQ_REQUEST_TIMEOUT \(15s?\S*\) must be below"):
        config.check()
    OperatorConfig(leader_lease_seconds=15, request_timeout=10).check()
    # Not set: 10 s, or three quarters of a shorter lease.
    assert OperatorConfig(leader_lease_seconds=15).request_seconds == 10
    short = OperatorConfig(leader_lease_seconds=4)
    short.check()
    assert short.request_seconds == 3
    # A single replica has no lease to outlast.
    OperatorConfig(leader_election=False, leader_lease_seconds=15, request_timeout=30).check()
    with pytest.raises(ValueError, match="renew deadline"):
        OperatorConfig(leader_lease_seconds=15, leader_renew_seconds=15).check()


def transitions(h: Harness) -> int:
    body = h.kube.objects[("leases", NS, "agentq-operator")]
    return int(body["spec"]["leaseTransitions"])


@run
async def test_every_takeover_raises_the_epoch_and_a_renewal_keeps_it() -> None:
    h = Harness()
    a, b = elector(h, "a"), elector(h, "b")
    assert await round_of(a)
    assert (a.epoch, transitions(h)) == (0, 0)  # created the Lease
    h.clock.advance(1.0)
    assert await round_of(a)
    assert (a.epoch, transitions(h)) == (0, 0)  # a renewal
    assert math.isclose(a.remaining(), RENEW_DEADLINE, abs_tol=0.01)
    h.clock.advance(1.0)
    assert math.isclose(a.remaining(), RENEW_DEADLINE - 1.0, abs_tol=0.01)

    assert not await round_of(b)  # b sees a's record and starts its own clock
    h.clock.advance(LEASE_SECONDS + 0.1)
    assert a.remaining() == 0 and not a.valid()
    assert await round_of(b)
    assert (b.epoch, transitions(h)) == (1, 1)  # a takeover
    h.clock.advance(LEASE_SECONDS + 0.1)
    assert not await round_of(a)  # a sees b's record and starts its own clock
    h.clock.advance(LEASE_SECONDS + 0.1)
    assert await round_of(a)
    assert (a.epoch, transitions(h)) == (2, 2)  # taken back: a new epoch, not a's old 0


@run
async def test_a_leader_that_stopped_leading_by_its_own_clock_comes_back_with_a_new_epoch() -> None:
    """Nobody took over, but its writes were cancelled and some may still land: what it
    sends from now on must not be confused with what it sent before (client-go counts a
    transition whenever an elector that is not leading acquires)."""
    h = Harness()
    a = elector(h, "a")
    assert await round_of(a)
    h.clock.advance(RENEW_DEADLINE + 0.1)
    a._set(False)  # the deadline passed without a renewal (the API server was away)
    assert not a.valid()
    assert await round_of(a)
    assert (a.epoch, transitions(h)) == (1, 1)


@run
async def test_a_grant_carries_the_epoch_the_leader_decided_it_under() -> None:
    h = Harness()
    c = h.controller
    e = elector(h, "a")
    e.on_change = c.set_leading
    assert await round_of(e)
    b = elector(h, "b")
    assert not await round_of(b)
    h.clock.advance(LEASE_SECONDS + 0.1)
    assert await round_of(b)
    assert not await round_of(e)  # a sees b's record
    h.clock.advance(LEASE_SECONDS + 0.1)
    assert await round_of(e)  # a leads again, with epoch 2
    c.use_elector(e)
    h.worker("w", "llm", max_in_flight=1, lease_seconds=60)
    h.task(task("t").requires("llm"))
    await h.settle()
    assert h.phase("t") == "Assigned"
    assert h.status("t")["leaderEpoch"] == e.epoch == 2


@run
async def test_without_leader_election_a_grant_carries_no_epoch() -> None:
    h = Harness()
    h.worker("w", "llm", max_in_flight=1, lease_seconds=60)
    h.task(task("t").requires("llm"))
    await h.settle()
    assert h.phase("t") == "Assigned"
    assert h.status("t").get("leaderEpoch") is None


@run
async def test_a_grant_refused_for_its_epoch_is_given_back_not_taken_for_a_refusal() -> None:
    h = Harness()
    c = h.controller
    real = h.kube.patch_status
    refused: list[str] = []

    async def deposed(*args: Any) -> Reply:
        if args[0] == "agenttasks" and not refused:
            refused.append(args[2])
            return Reply(
                Status.FORBIDDEN,
                None,
                'agenttasks.agentq.dev "t" is forbidden: ValidatingAdmissionPolicy '
                "'agentq-leader-epoch' with binding 'agentq-leader-epoch' denied request: "
                "grant of t refused",
            )
        return await real(*args)

    h.kube.patch_status = deposed  # type: ignore[method-assign]
    h.worker("w", "llm", max_in_flight=1, lease_seconds=60)
    h.task(task("t").requires("llm"))
    await h.settle()
    assert refused == ["t"]
    assert (c.stats.deposed, c.stats.refused) == (1, 0)
    assert h.phase("t") in (None, "Pending")
    assert h.core().worker_state("w").in_flight == 0  # the decision was given back
    await h.advance(5.0)  # the leader of the moment (here: still us) grants it
    assert h.phase("t") == "Assigned"


@run
async def test_a_stale_policy_epoch_above_the_lease_we_hold_is_taken_at_the_next_round() -> None:
    """The policy named leaseTransitions 3 while the Lease we hold says 0 (its parameter
    cache kept an earlier install's Lease: kubernetes/kubernetes#130887): our next
    renewal raises the Lease to 3 and grants carry it; said by the gauge."""
    h = Harness()
    a = elector(h, "a")
    assert await round_of(a)
    assert (a.epoch, transitions(h)) == (0, 0)
    a.epoch_refused(3)
    h.clock.advance(1.0)
    assert await round_of(a)
    assert (a.epoch, transitions(h)) == (3, 3)
    assert REGISTRY.get_sample_value("agentq_leader_epoch_policy_stale") == 1
    a.epoch_refused(2)  # an older refusal, late: nothing moves
    h.clock.advance(1.0)
    assert await round_of(a)
    assert (a.epoch, transitions(h)) == (3, 3)


@run
async def test_a_refusal_for_a_real_takeover_only_deposes_the_old_leader() -> None:
    """Refused because b took over (the Lease says so): a stops leading at its next round
    and raises nothing; b's epoch stands."""
    h = Harness()
    a, b = elector(h, "a"), elector(h, "b")
    assert await round_of(a)
    assert not await round_of(b)
    h.clock.advance(LEASE_SECONDS + 0.1)
    assert await round_of(b)
    assert (b.epoch, transitions(h)) == (1, 1)
    a.epoch_refused(1)
    assert not await round_of(a)  # b's record: a does not lead
    assert not a.leading and transitions(h) == 1 and b.epoch == 1


@run
async def test_a_refusal_names_the_policy_epoch_to_the_elector() -> None:
    """The dispatcher hands the leaseTransitions of the policy's message to the elector."""
    h = Harness()
    c = h.controller
    e = elector(h, "a", c)
    e.on_change = c.set_leading
    assert await round_of(e)
    c.use_elector(e)
    told: list[int] = []
    c.leader_epoch_refused = told.append
    real = h.kube.patch_status

    async def stale(*args: Any) -> Reply:
        if args[0] == "agenttasks" and not told:
            return Reply(
                Status.FORBIDDEN,
                None,
                "ValidatingAdmissionPolicy 'agentq-leader-epoch' with binding "
                "'agentq-leader-epoch' denied request: grant of t refused: its leader epoch "
                "(0) is older than the leaseTransitions (7) of the operator election Lease "
                "ns/agentq-operator: the replica that made it no longer leads",
            )
        return await real(*args)

    h.kube.patch_status = stale  # type: ignore[method-assign]
    h.worker("w", "llm", max_in_flight=1, lease_seconds=60)
    h.task(task("t").requires("llm"))
    await h.settle()
    assert told == [7]
