"""Lease expiry judged on the observer's own monotonic clock (as client-go does).

A holder writes ``renewTime`` with *its* wall clock, which may be wrong or may
jump; the observer never compares that value with its own wall clock. Instead
it remembers when it last *observed the lease record change* (holder, renew
time, fencing token, progress) and calls the lease expired once
``leaseDurationSeconds`` pass on its monotonic clock without a change. So a
wall-clock jump on any machine expires nothing, and an observer that just
started gives every lease a full duration before judging it.

Progress is tracked the same way: the time the progress marker was last seen
to change, for ``progressDeadlineSeconds``.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(frozen=True)
class LeaseRecord:
    """The parts of a Lease whose change proves the holder is alive."""

    holder: str | None
    renew_time: str | None
    duration: float
    token: int | None = None
    progress: str | None = None


@dataclass
class _Observation:
    record: LeaseRecord
    changed_at: float
    progress_changed_at: float


class LeaseTracker:
    """Remembers, per lease key, when its record last changed on our clock."""

    def __init__(self) -> None:
        self._seen: dict[Hashable, _Observation] = {}

    def observe(self, key: Hashable, record: LeaseRecord, now: float, *, age: float = 0.0) -> bool:
        """Record what the lease looks like at ``now``; True if it changed (or is new).

        ``age`` applies to a lease seen for the first time only: how long ago to
        pretend its last change was (0, the default, gives it a full duration).
        """
        seen = self._seen.get(key)
        if seen is None:
            self._seen[key] = _Observation(record, now - age, now - age)
            return True
        if record == seen.record:
            return False
        if record.progress != seen.record.progress or record.token != seen.record.token:
            seen.progress_changed_at = now
        # Only a change of what the holder writes proves life; a new duration alone does not.
        if (record.holder, record.renew_time, record.token, record.progress) != (
            seen.record.holder,
            seen.record.renew_time,
            seen.record.token,
            seen.record.progress,
        ):
            seen.changed_at = now
        seen.record = record
        return True

    def forget(self, key: Hashable) -> None:
        self._seen.pop(key, None)

    def record(self, key: Hashable) -> LeaseRecord | None:
        seen = self._seen.get(key)
        return seen.record if seen else None

    def last_change(self, key: Hashable) -> float | None:
        """When (monotonic) the record was last seen to change."""
        seen = self._seen.get(key)
        return None if seen is None else seen.changed_at

    def expires_at(self, key: Hashable) -> float | None:
        """The monotonic time at which the lease expires unless it changes first."""
        seen = self._seen.get(key)
        return None if seen is None else seen.changed_at + seen.record.duration

    def expired(self, key: Hashable, now: float) -> bool:
        deadline = self.expires_at(key)
        return deadline is not None and now >= deadline

    def fresh(self, key: Hashable, now: float) -> bool:
        """Known and not expired."""
        deadline = self.expires_at(key)
        return deadline is not None and now < deadline

    def progress_stalled_for(self, key: Hashable, now: float) -> float:
        """Seconds since the progress marker (or the token) last changed; 0 if unknown."""
        seen = self._seen.get(key)
        return 0.0 if seen is None else now - seen.progress_changed_at

    def known(self) -> list[Hashable]:
        return list(self._seen)
