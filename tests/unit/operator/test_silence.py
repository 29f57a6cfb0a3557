"""A silent API server is not counted against holders (``agentq.operator.silence``).

An API server that answers nothing -- stopped, starved, paused -- keeps its
connections open, so the watches look healthy while no holder can renew. The
time a request of ours waited with nothing at all heard is given back to every
Lease, and an expiry decided before it is decided again instead of committed.
"""

from __future__ import annotations

import asyncio

import pytest

from agentq.claims import Readiness
from agentq.clock import FakeClock
from agentq.operator.fake import FakeKube, Held
from agentq.operator.port import KubeError
from agentq.operator.silence import ApiSilence, HeardKube, pulse
from builders import task
from harness import Harness, run


def silence(threshold: float = 2.0) -> tuple[ApiSilence, FakeClock, list[float]]:
    clock = FakeClock()
    s = ApiSilence(clock, threshold)
    credited: list[float] = []
    s.listen(credited.append)
    return s, clock, credited


def test_a_request_answered_after_a_silence_gives_the_silence_back() -> None:
    s, clock, credited = silence()
    s.sent()
    clock.advance(5)
    s.answered()
    assert credited == [pytest.approx(5)]


def test_a_silence_below_the_threshold_gives_nothing_back() -> None:
    s, clock, credited = silence()
    s.sent()
    clock.advance(1.9)
    s.answered()
    assert credited == []


def test_a_slow_but_serving_api_server_is_not_silent() -> None:
    # One slow request, but watch lines (and other replies) keep coming meanwhile.
    s, clock, credited = silence()
    s.sent()
    for _ in range(10):
        clock.advance(1)
        s.heard()
    s.answered()
    assert credited == []


def test_overlapping_requests_give_the_silence_back_once() -> None:
    s, clock, credited = silence()
    s.sent()
    clock.advance(1)
    s.sent()
    clock.advance(4)
    s.answered()  # the first: 5 s since it went out
    s.answered()  # the second: nothing more
    assert credited == [pytest.approx(5)]


def test_a_request_that_timed_out_leaves_the_silence_open() -> None:
    s, clock, credited = silence()
    s.sent()
    clock.advance(3)
    s.unanswered()  # timed out: nothing heard yet
    clock.advance(1)
    s.sent()
    clock.advance(2)
    s.answered()
    assert credited == [pytest.approx(6)]


def test_nothing_is_silent_while_nothing_is_asked() -> None:
    s, clock, credited = silence()
    clock.advance(60)
    s.heard()
    s.sent()
    s.answered()
    assert credited == []


async def expiry_in_a_silence(h: Harness) -> asyncio.Event:
    """t0 held (3 s lease, renewed once); then the API server stops answering: a request
    of ours waits from here on (in the operator, the elector's every 2 s), the holder
    cannot renew, the lease ends on our clock and the confirming read waits too. Set
    the returned gate to answer that read; 6 s of silence have passed by then."""
    h.worker("w1", "llm", lease_seconds=1000)
    h.task(task("t0").requires("llm").lease(3).backoff(initial=0))
    await h.advance(0.5)
    h.renew("t0")
    await h.settle()
    assert h.phase("t0") == "Running"
    h.clock.advance(0.5)
    h.silence.sent()
    gate = asyncio.Event()
    h.kube.inject("get_lease", Held(gate))
    h.clock.advance(3)
    await h.steps(50)
    assert h.kube.calls["get_lease"] >= 1, "the expiry was judged and its read sent"
    h.clock.advance(3)
    return gate


@run
async def test_an_expiry_whose_confirming_read_waited_through_a_silence_is_not_committed() -> None:
    h = Harness(heard=True)
    gate = await expiry_in_a_silence(h)
    gate.set()  # it answers again: the read first (the Lease unchanged) ...
    for _ in range(50):
        await asyncio.sleep(0)
    h.silence.answered()
    h.renew("t0")  # ... then the holder's renewal that waited in the same queue
    await h.settle()
    assert h.controller.stats.api_silences == 1
    assert h.phase("t0") == "Running" and not h.status("t0").get("reclaims")


@run
async def test_a_claim_whose_holder_died_is_still_reclaimed_after_a_silence() -> None:
    h = Harness(heard=True)
    gate = await expiry_in_a_silence(h)
    gate.set()
    h.silence.answered()
    await h.settle()
    assert not h.status("t0").get("reclaims"), "not in the second the API server answered"
    assert h.controller.stats.api_silences == 1
    await h.advance(3)  # the holder is dead: nothing renews in the time given back
    assert h.status("t0").get("reclaims") == 1


@run
async def test_a_worker_whose_lease_ended_in_a_silence_is_ready_again_once_it_answers() -> None:
    h = Harness(heard=True)
    h.worker("w1", "llm", lease_seconds=3)
    await h.settle()
    assert h.readiness("w1") is Readiness.READY
    # The API server stops answering: nothing renews, and the worker's status write (its
    # Lease ended on our clock) waits like every other request.
    gate = asyncio.Event()
    h.kube.inject("patch_status", Held(gate))
    h.silence.sent()
    h.clock.advance(4)
    await h.steps(50)
    assert h.readiness("w1") is Readiness.LEASE_STALE
    gate.set()  # it answers again: the 4 s are given back
    await h.settle()
    assert h.controller.stats.api_silences == 1
    assert h.readiness("w1") is Readiness.READY, "not at its next renewal"


@run
async def test_pulse_asks_the_api_server_regularly_until_stopped() -> None:
    # With leader election off it is what a silence is counted from.
    kube = FakeKube()
    stop = asyncio.Event()
    task = asyncio.create_task(pulse(kube, "ns", "agentq-operator", stop, period=0.01))
    await asyncio.sleep(0.1)
    assert kube.calls["get_lease"] >= 3  # a 404 each time: as good an answer
    stop.set()
    await asyncio.wait_for(task, timeout=1)


@run
async def test_a_refusal_is_an_answer_and_a_5xx_or_a_timeout_is_not() -> None:
    s, clock, credited = silence()
    kube = FakeKube()
    heard = HeardKube(kube, s)
    for outcome in (KubeError("HTTP 503: etcd away", 503), KubeError("timeout")):
        kube.inject("get_lease", outcome)
        with pytest.raises(KubeError):
            await heard.get_lease("ns", "x")
    clock.advance(5)
    kube.inject("get_lease", KubeError("HTTP 403: forbidden", 403))
    with pytest.raises(KubeError):
        await heard.get_lease("ns", "x")  # served (refused): the silence ends here
    assert credited == [pytest.approx(5)]
    clock.advance(60)  # nothing asked meanwhile
    await heard.get_lease("ns", "x")  # a 404 reply
    assert credited == [pytest.approx(5)], "no silence after an answer, even a refusal"


@run
async def test_a_stop_of_the_operator_itself_is_not_given_back_twice() -> None:
    # A request out while this process was SIGSTOPped waited through the stop too: the
    # watchdog gives the stop back as a stall, and the reply must not give it again.
    h = Harness(heard=True)
    h.worker("w1", "llm", lease_seconds=1000)
    h.task(task("t0").requires("llm").lease(30))
    await h.advance(0.5)
    h.renew("t0")
    await h.settle()
    key = ("ns", "agentq-task-t0")
    before = h.controller.store.leases[key].seen.expires_at()
    assert before is not None
    h.silence.sent()
    h.clock.advance(10)
    h.controller.note_stall(10)  # what the watchdog says when the process runs again
    h.silence.answered()  # the reply, 10 s after it was asked for
    assert h.controller.store.leases[key].seen.expires_at() == pytest.approx(before + 10, abs=0.01)
    assert h.controller.stats.api_silences == 0
