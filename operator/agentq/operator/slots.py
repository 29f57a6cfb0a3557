"""How many API requests the operator has in flight at once, decisions first.

The API server is the bottleneck of a backlog drain or a burst of reclaims (a
status patch of a custom resource costs it several times a Lease create), so
what the operator sends it first matters more than how much it sends at once:

- ``high()``: a decision's writes and the reads it waits on (a status
  compare-and-swap, the grant's Lease, an expiry's confirmation) -- first come,
  first served among themselves;
- ``low()``: writes nothing waits on (Events, the Lease delete that tidies up
  after an attempt ended): they take a slot only while no ``high()`` request is
  waiting for one, and while ``high()`` requests are in flight at most
  ``low_share`` slots (an eighth by default): a burst of decisions (500 reclaims
  at once) keeps most of the API server, the Events and deletes it causes
  follow it instead of halving its rate.

A low request waits at most ``max_wait`` seconds; after that it takes the next free
slot like a high one, so a sustained overload slows Events down but never stops
them (the EventSink's bounded queue drops the oldest if they still fall behind).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator

from agentq.clock import Clock


class Slots:
    def __init__(
        self, size: int, *, clock: Clock, max_wait: float = 10.0, low_share: int | None = None
    ) -> None:
        if size < 1:
            raise ValueError("at least one slot")
        self.size = size
        self.clock = clock
        self.max_wait = max_wait
        self.low_share = max(1, size // 8) if low_share is None else max(1, low_share)
        self.high_used = 0
        self.low_used = 0
        self._high: collections.deque[asyncio.Future[None]] = collections.deque()
        self._low: collections.deque[tuple[float, asyncio.Future[None]]] = collections.deque()

    @property
    def used(self) -> int:
        return self.high_used + self.low_used

    @property
    def waiting(self) -> int:
        """Decision requests waiting for a slot (the pressure on the API server)."""
        return len(self._high)

    @contextlib.asynccontextmanager
    async def high(self) -> AsyncIterator[None]:
        await self._acquire(low=False)
        try:
            yield
        finally:
            self._release(low=False)

    @contextlib.asynccontextmanager
    async def low(self) -> AsyncIterator[None]:
        await self._acquire(low=True)
        try:
            yield
        finally:
            self._release(low=True)

    def _low_may_go(self) -> bool:
        return self.high_used == 0 or self.low_used < self.low_share

    async def _acquire(self, *, low: bool) -> None:
        if self.used < self.size and not self._high:
            if not low:
                self._take(low=False)
                return
            if not self._low and self._low_may_go():
                self._take(low=True)
                return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if low:
            self._low.append((self.clock.monotonic(), future))
        else:
            self._high.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release(low=low)  # the slot was handed to us as we were cancelled
            raise

    def _take(self, *, low: bool) -> None:
        if low:
            self.low_used += 1
        else:
            self.high_used += 1

    def _release(self, *, low: bool) -> None:
        if low:
            self.low_used -= 1
        else:
            self.high_used -= 1
        self._hand_over()

    def _hand_over(self) -> None:
        while self.used < self.size:
            picked = self._next()
            if picked is None:
                return
            future, low = picked
            self._take(low=low)
            future.set_result(None)

    def _next(self) -> tuple[asyncio.Future[None], bool] | None:
        # A low request that waited too long goes first: Events slow down, never stop.
        while self._low and self._low[0][1].done():
            self._low.popleft()
        if self._low and self.clock.monotonic() - self._low[0][0] >= self.max_wait:
            return self._low.popleft()[1], True
        while self._high:
            future = self._high.popleft()
            if not future.done():
                return future, False
        while self._low and self._low_may_go():
            _, future = self._low.popleft()
            if not future.done():
                return future, True
        return None


__all__ = ["Slots"]
