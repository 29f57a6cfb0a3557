"""Time, injected: every judgement of expiry, backoff or readiness takes a ``Clock``.

``monotonic()`` is the only time used to judge lease expiry (it never jumps);
``now()`` is wall-clock time, used only for timestamps written for people and
for delays that are safe to get wrong (retry backoff).
"""

from __future__ import annotations

import datetime
import time
from typing import Protocol


class Clock(Protocol):
    """A source of monotonic seconds and of wall-clock time."""

    def monotonic(self) -> float: ...

    def now(self) -> datetime.datetime: ...


class SystemClock:
    """The real clocks of this process."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime.datetime:
        return datetime.datetime.now(datetime.UTC)


class FakeClock:
    """A clock tests move by hand; the wall clock can jump independently."""

    def __init__(self, *, start: float = 1000.0, wall: datetime.datetime | None = None) -> None:
        self._mono = start
        self._wall = wall or datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)

    def monotonic(self) -> float:
        return self._mono

    def now(self) -> datetime.datetime:
        return self._wall

    def advance(self, seconds: float) -> None:
        """Both clocks move forward together, as real time does."""
        self._mono += seconds
        self._wall += datetime.timedelta(seconds=seconds)

    def jump_wall(self, seconds: float) -> None:
        """Only the wall clock moves (NTP step, a VM resumed, an operator's mistake)."""
        self._wall += datetime.timedelta(seconds=seconds)


def rfc3339(moment: datetime.datetime) -> str:
    """Kubernetes' timestamp format with seconds precision, e.g. ``2026-01-01T00:00:00Z``."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro_rfc3339(moment: datetime.datetime) -> str:
    """Kubernetes' MicroTime format (used by Lease renewTime and acquireTime)."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str | None) -> datetime.datetime | None:
    if not text:
        return None
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
