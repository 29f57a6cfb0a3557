"""Lease expiry is judged on the observer's monotonic clock, never the holder's timestamps."""

from __future__ import annotations

from agentq.clock import FakeClock
from agentq.expiry import LeaseRecord, LeaseTracker


def record(
    renew: str,
    *,
    holder: str = "w1",
    duration: float = 10,
    token: int = 1,
    progress: str | None = None,
) -> LeaseRecord:
    return LeaseRecord(
        holder=holder, renew_time=renew, duration=duration, token=token, progress=progress
    )


def test_a_lease_expires_one_duration_after_its_last_observed_change() -> None:
    clock, tracker = FakeClock(), LeaseTracker()
    tracker.observe("k", record("t0"), clock.monotonic())
    clock.advance(9.9)
    assert not tracker.expired("k", clock.monotonic())
    tracker.observe("k", record("t1"), clock.monotonic())  # renewed
    clock.advance(9.9)
    assert not tracker.expired("k", clock.monotonic())
    clock.advance(0.1)
    assert tracker.expired("k", clock.monotonic())


def test_seeing_the_same_record_again_is_not_a_renewal() -> None:
    clock, tracker = FakeClock(), LeaseTracker()
    tracker.observe("k", record("t0"), clock.monotonic())
    clock.advance(6)
    assert not tracker.observe("k", record("t0"), clock.monotonic())
    clock.advance(4)
    assert tracker.expired("k", clock.monotonic())


def test_a_wall_clock_jump_expires_nothing() -> None:
    clock, tracker = FakeClock(), LeaseTracker()
    tracker.observe("k", record("2026-01-01T00:00:00Z"), clock.monotonic())
    clock.jump_wall(3600 * 24)  # the wall clock leaps a day; real time barely moves
    clock.advance(1)
    assert tracker.fresh("k", clock.monotonic())
    # And a holder whose clock is a day behind still renews fine: only change matters.
    tracker.observe("k", record("2025-12-31T00:00:05Z"), clock.monotonic())
    clock.advance(9)
    assert tracker.fresh("k", clock.monotonic())


def test_a_new_observer_gives_every_lease_a_full_duration() -> None:
    clock, tracker = FakeClock(), LeaseTracker()
    clock.advance(10_000)  # the lease's renewTime is ancient, but we just started
    tracker.observe("k", record("1999-01-01T00:00:00Z"), clock.monotonic())
    clock.advance(9.9)
    assert tracker.fresh("k", clock.monotonic())
    clock.advance(0.1)
    assert tracker.expired("k", clock.monotonic())


def test_age_backdates_a_first_observation_only() -> None:
    clock, tracker = FakeClock(), LeaseTracker()
    tracker.observe("k", record("t0"), clock.monotonic(), age=10)
    assert tracker.expired("k", clock.monotonic())
    tracker.observe("k", record("t1"), clock.monotonic(), age=10)
    assert tracker.fresh("k", clock.monotonic())


def test_progress_stall_is_measured_from_the_last_progress_change() -> None:
    clock, tracker = FakeClock(), LeaseTracker()
    tracker.observe("k", record("t0", progress="a"), clock.monotonic())
    for i in range(5):  # renewed every 2 s, progress never moves
        clock.advance(2)
        tracker.observe("k", record(f"t{i + 1}", progress="a"), clock.monotonic())
    assert tracker.fresh("k", clock.monotonic())
    assert tracker.progress_stalled_for("k", clock.monotonic()) == 10
    tracker.observe("k", record("t9", progress="b"), clock.monotonic())
    assert tracker.progress_stalled_for("k", clock.monotonic()) == 0


def test_a_new_token_restarts_the_progress_clock() -> None:
    clock, tracker = FakeClock(), LeaseTracker()
    tracker.observe("k", record("t0", token=1, progress="a"), clock.monotonic())
    clock.advance(30)
    tracker.observe("k", record("t1", token=2, progress="a"), clock.monotonic())
    assert tracker.progress_stalled_for("k", clock.monotonic()) == 0


def test_forgotten_leases_are_unknown() -> None:
    clock, tracker = FakeClock(), LeaseTracker()
    tracker.observe("k", record("t0"), clock.monotonic())
    tracker.forget("k")
    assert tracker.expires_at("k") is None
    assert not tracker.expired("k", clock.monotonic())
    assert not tracker.fresh("k", clock.monotonic())
