"""Time the operator could not watch is not counted against holders.

Two kinds of blindness, noticed apart and given back the same way:

- **a stall of this process** (SIGSTOP, a starved host, a paused VM): a
  watchdog ticks every ``period``; a tick much later than due means the event
  loop did not run (time spent in our own steps aside: a step deciding 500
  reclaims must not credit every Lease and delay those very reclaims);
- **a silence of the API server** (``silence.ApiSilence`` reports it): it
  answered nothing while a request of ours waited, so the holders could not
  renew either.

Either way every Lease and grace period gets the blind time back
(``Store.credit``), less what was given back already (a stall and a silence may
be the same time, seen twice), and ``credits`` moves: an expiry decided before
and not yet committed is decided again (``commit.Committer``).
"""

from __future__ import annotations

import asyncio
import logging
import math

from agentq.clock import Clock
from agentq.operator import metrics
from agentq.operator.store import Store
from agentq.operator.work import Stats

__all__ = ["BlindTime"]

log = logging.getLogger("agentq.controller")


class BlindTime:
    """The stall watchdog and the give-back (see the module docstring)."""

    def __init__(
        self,
        *,
        store: Store,
        clock: Clock,
        stats: Stats,
        stall_seconds: float,
        silence_seconds: float,
        period: float = 0.25,
    ) -> None:
        self.store = store
        self.clock = clock
        self.stats = stats
        self.stall_seconds = stall_seconds
        self.silence_seconds = silence_seconds
        self.period = period
        self.credits = 0  # times time was given back
        self._given_until = -math.inf  # time up to which it was given back
        self._last_tick = clock.monotonic()
        self._worked = 0.0  # seconds spent in steps since the last tick
        self._watchdog: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._last_tick = self.clock.monotonic()
        self._watchdog = asyncio.create_task(self._watch(), name="watchdog")

    def stop(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()

    def worked(self, seconds: float) -> None:
        """A step took ``seconds``: not a stall."""
        self._worked += seconds

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.period)
            try:
                self.check()
            except Exception:  # the watchdog must outlive anything it meets
                log.exception("the stall watchdog failed; it goes on")

    def check(self) -> None:
        """Called by the watchdog every ``period`` and before every step."""
        if self._watchdog is None:
            return
        now = self.clock.monotonic()
        lag = now - self._last_tick - self.period - self._worked
        self._worked = 0.0
        self._last_tick = now
        metrics.LOOP_LAG.set(max(0.0, lag))
        if lag > self.stall_seconds:
            self.note_stall(lag)

    def note_stall(self, seconds: float) -> None:
        log.warning(
            "the operator did not run for %.1fs; that time is not counted against leases",
            seconds,
        )
        self.stats.stalls += 1
        self.stats.stalled_seconds += seconds
        self._give_back(seconds)

    def note_api_silence(self, seconds: float) -> None:
        """The API server answered nothing for ``seconds`` while we waited. (A request out
        while this process itself was stopped waited through that stop too: that part
        was given back as a stall.)"""
        given = self._give_back(seconds, at_least=self.silence_seconds)
        if not given:
            return
        log.warning(
            "the API server answered nothing for %.1fs; that time is not counted against leases",
            given,
        )
        metrics.API_SILENCE.inc(given)
        self.stats.api_silences += 1

    def _give_back(self, seconds: float, *, at_least: float = 0.0) -> float:
        """Give back the last ``seconds`` less what was given already, if that is
        ``at_least``; returns what was given."""
        now = self.clock.monotonic()
        given = now - max(now - seconds, self._given_until)
        if given <= 0 or given < at_least:
            return 0.0
        self._given_until = now
        self.credits += 1
        self.store.credit(given)
        return given
