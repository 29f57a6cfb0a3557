"""The one retry delay of agentq's API clients: exponential, capped, jittered.

Used by every loop that talks to the API server again after a failure (the
operator's informers and kopf watch hook, the sidecar's renewals, watches and
registration): a delay doubles from ``initial`` up to ``maximum`` and each is
drawn from its upper half, so a fleet restarted together does not retry in
step. ``reset()`` after a success.
"""

from __future__ import annotations

import asyncio
import contextlib
import random


class Backoff:
    """Exponential backoff with jitter, for reconnects and retries."""

    def __init__(
        self, *, initial: float = 0.2, maximum: float = 5.0, rand: random.Random | None = None
    ) -> None:
        self.initial = initial
        self.maximum = maximum
        self.failures = 0
        self._rand = rand or random.Random()

    def reset(self) -> None:
        self.failures = 0

    def next(self) -> float:
        """The next delay: ``initial * 2**failures`` capped at ``maximum``, half to all of it."""
        ceiling = min(self.maximum, self.initial * (2 ** min(self.failures, 32)))
        self.failures += 1
        return float(ceiling * (0.5 + self._rand.random() / 2))

    async def sleep(self, stop: asyncio.Event | None = None) -> None:
        """Sleep the next delay, or less if ``stop`` is set meanwhile."""
        delay = self.next()
        if stop is None:
            await asyncio.sleep(delay)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=delay)


__all__ = ["Backoff"]
