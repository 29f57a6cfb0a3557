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

The duration a lease is judged by is the caller's to give: for a task claim it
is the TASK's ``spec.leaseDurationSeconds``, never the Lease's own field, which
its holder can edit (a holder that wrote 86400 there would never expire).

Time the observer did not observe does not count against a holder: after a
stall of the observer (``credit``, e.g. its process was stopped, or its watch
was down) every lease is given back the stalled time, so an observer that wakes
up does not reclaim every lease at once.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(frozen=True)
class LeaseRecord:
    """The parts of a Lease whose change proves the holder is alive."""

    holder: str | None
    renew_time: str | None
    duration: float = 0.0  # the default duration to judge by (callers may pass their own)
    token: int | str | None = None
    progress: str | None = None


@dataclass
class Observation:
    """What one observer knows of one lease: its record and when (on the observer's
    monotonic clock) the record and its progress marker were last seen to change."""

    record: LeaseRecord
    changed_at: float
    progress_changed_at: float

    @classmethod
    def first(cls, record: LeaseRecord, now: float, *, age: float = 0.0) -> Observation:
        """A lease seen for the first time; ``age``: how long ago to pretend its last
        change was (0 gives it a full duration)."""
        return cls(record, now - age, now - age)

    def observe(self, record: LeaseRecord, now: float) -> bool:
        """Record what the lease looks like at ``now``; True if it changed."""
        if record == self.record:
            return False
        if record.progress != self.record.progress or record.token != self.record.token:
            self.progress_changed_at = now
        # Only a change of what the holder writes proves life; a new duration alone does not.
        if (record.holder, record.renew_time, record.token, record.progress) != (
            self.record.holder,
            self.record.renew_time,
            self.record.token,
            self.record.progress,
        ):
            self.changed_at = now
        self.record = record
        return True

    def expires_at(self, duration: float | None = None) -> float:
        """When the lease expires unless it changes first (``duration``: the lease
        duration to judge by; default: the record's own)."""
        return self.changed_at + (self.record.duration if duration is None else duration)

    def fresh(self, now: float, duration: float | None = None) -> bool:
        return now < self.expires_at(duration)

    def credit(self, seconds: float) -> None:
        """The observer was blind for ``seconds``: the lease gets that time back."""
        self.changed_at += seconds
        self.progress_changed_at += seconds


class LeaseTracker:
    """Remembers, per lease key, when its record last changed on our clock."""

    def __init__(self) -> None:
        self._seen: dict[Hashable, Observation] = {}

    def observe(self, key: Hashable, record: LeaseRecord, now: float, *, age: float = 0.0) -> bool:
        """Record what the lease looks like at ``now``; True if it changed (or is new).

        ``age`` applies to a lease seen for the first time only: how long ago to
        pretend its last change was (0, the default, gives it a full duration).
        """
        seen = self._seen.get(key)
        if seen is None:
            self._seen[key] = Observation.first(record, now, age=age)
            return True
        return seen.observe(record, now)

    def forget(self, key: Hashable) -> None:
        self._seen.pop(key, None)

    def record(self, key: Hashable) -> LeaseRecord | None:
        seen = self._seen.get(key)
        return seen.record if seen else None

    def last_change(self, key: Hashable) -> float | None:
        """When (monotonic) the record was last seen to change."""
        seen = self._seen.get(key)
        return None if seen is None else seen.changed_at

    def expires_at(self, key: Hashable, duration: float | None = None) -> float | None:
        """The monotonic time at which the lease expires unless it changes first.

        ``duration``: the lease duration to judge by (default: the record's own).
        """
        seen = self._seen.get(key)
        return None if seen is None else seen.expires_at(duration)

    def expired(self, key: Hashable, now: float, duration: float | None = None) -> bool:
        deadline = self.expires_at(key, duration)
        return deadline is not None and now >= deadline

    def fresh(self, key: Hashable, now: float, duration: float | None = None) -> bool:
        """Known and not expired."""
        deadline = self.expires_at(key, duration)
        return deadline is not None and now < deadline

    def progress_changed_at(self, key: Hashable) -> float | None:
        seen = self._seen.get(key)
        return None if seen is None else seen.progress_changed_at

    def progress_stalled_for(self, key: Hashable, now: float) -> float:
        """Seconds since the progress marker (or the token) last changed; 0 if unknown."""
        seen = self._seen.get(key)
        return 0.0 if seen is None else now - seen.progress_changed_at

    def credit(self, seconds: float) -> None:
        """The observer was blind for ``seconds`` (stopped, or its watch was down):
        every lease gets that time back: what was left of its duration when the
        blindness began is left again when it ends. O(leases); blindness is rare."""
        if seconds <= 0:
            return
        for seen in self._seen.values():
            seen.credit(seconds)

    def __len__(self) -> int:
        return len(self._seen)

    def known(self) -> list[Hashable]:
        return list(self._seen)
