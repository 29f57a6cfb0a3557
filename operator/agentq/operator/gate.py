"""The request gate: every API call the controller's parts make goes through here.

- A decision's call (``call``, ``sending``) takes a high-priority slot
  (``slots.Slots``) and is sent only if this replica may still send: leadership
  is checked again as the call is about to go out, not only when the decision
  was made -- a decision may wait for a slot, or the process may be stopped
  between deciding and sending, for longer than the renew deadline, and by then
  a standby may lead and have decided otherwise (a worker granted twice over its
  maxInFlight). Such a call raises ``NotLeading`` (nothing was sent).
- A decision's call is given at most ``min(request timeout, the leader's remaining
  validity)`` (``remaining``: the renew deadline less the time since the last
  renewal): no request of a leader is still waited on once a standby may have taken
  over; past it the outcome is unknown (``KubeError``), as for any timeout. A request
  the API server already holds may still be applied after that: the grants carry the
  leader's epoch for the admission policy to refuse (manifests/leader-epoch-policy.yaml).
- A call nothing waits on (``call_low``: a Lease delete that tidies up) takes a
  low-priority slot.
- Writes run as tasks of their own (``spawn``), tracked so that losing the lead
  cancels them all and a graceful stop can wait for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from agentq.operator.port import KubeError, NotLeading, Reply
from agentq.operator.slots import Slots

__all__ = ["RequestGate"]

log = logging.getLogger("agentq.controller")


class RequestGate:
    """Slots, the leadership check at sending time, and the writes in flight."""

    def __init__(
        self,
        slots: Slots,
        *,
        may_send: Callable[[], bool],
        on_done: Callable[[], None],
        timeout: float = math.inf,
        remaining: Callable[[], float] = lambda: math.inf,
    ) -> None:
        self.slots = slots
        self.may_send = may_send
        self.timeout = timeout  # REQUEST_TIMEOUT
        self.remaining = remaining  # the leader's remaining validity (s)
        self.on_done = on_done  # a write ended: the loop looks again
        self.writes: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.writes.add(task)
        task.add_done_callback(self._write_done)
        return task

    def _write_done(self, task: asyncio.Task[Any]) -> None:
        self.writes.discard(task)
        if not task.cancelled():
            err = task.exception()
            if err is not None and not isinstance(err, NotLeading):
                log.error("a write failed: %r", err, exc_info=err)
        self.on_done()

    def cancel_all(self) -> None:
        for task in list(self.writes):
            task.cancel()

    def budget(self) -> float:
        """How long a decision's request sent now may take: min(request timeout, the
        leader's remaining validity)."""
        return min(self.timeout, self.remaining())

    async def call(self, method: Callable[..., Awaitable[Reply]], *args: Any) -> Reply:
        """One API call a decision waits on (see the module docstring)."""
        async with self.sending(getattr(method, "__name__", "call")):
            return await method(*args)

    @contextlib.asynccontextmanager
    async def sending(self, what: str) -> AsyncIterator[None]:
        """A decision slot, and leadership checked once it is ours: for a caller that
        must act at the moment its request goes out (confirming expiries). What runs
        inside is cut at ``budget()`` (then ``KubeError``: outcome unknown)."""
        async with self.slots.high():
            if not self.may_send():
                raise NotLeading(f"{what}: not sent, not leading")
            budget = self.budget()
            if budget <= 0:
                raise NotLeading(f"{what}: not sent, the leader lease has run out")
            try:
                async with asyncio.timeout(None if math.isinf(budget) else budget):
                    yield
            except TimeoutError as err:
                raise KubeError(
                    f"{what}: no answer within {budget:.2f}s (the request timeout or what "
                    "was left of the leader lease)"
                ) from err

    async def call_low(self, method: Callable[..., Awaitable[Reply]], *args: Any) -> Reply:
        """One API call nothing waits on: only while no decision waits for a slot."""
        async with self.slots.low():
            return await method(*args)
