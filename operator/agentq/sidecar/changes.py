"""A wake-up shared by the sidecar's loops: "something about the attempts changed".

The watcher, the HTTP handlers and the writes call ``notify`` after each change of
the sidecar's state. The renewal loop ``wait``s for any change (with a timeout, so
a missed wake-up costs at most one timeout). The agent's long polls wait for a
condition of their own (``wait_until``): it is checked at each ``notify`` and only
a waiter whose condition holds is woken, so a heartbeat or a renewal does not
wake a poll that waits for a new assignment.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable


class Changes:
    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._waiters: dict[asyncio.Future[None], Callable[[], bool]] = {}

    def notify(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()
        for future, ready in list(self._waiters.items()):
            if future.done():
                continue
            try:
                if ready():
                    future.set_result(None)
            except Exception as err:  # the waiter's own bug: raised in the waiter
                future.set_exception(err)

    async def wait(self, timeout: float) -> bool:
        """Wait for the next ``notify`` (True) or ``timeout`` seconds (False)."""
        event = self._event
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=max(0.0, timeout))
            return True
        return False

    async def wait_until(self, ready: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``ready()`` holds (True) or ``timeout`` seconds pass (False).

        ``ready`` is checked now, then at each ``notify`` (never in between): what it
        reads must change only before a ``notify``. Checked and registered with no
        ``await`` in between, so a change cannot slip past unseen.
        """
        if ready():
            return True
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[future] = ready
        try:
            async with asyncio.timeout(max(0.0, timeout)):
                await future
            return True
        except TimeoutError:
            return False
        finally:
            self._waiters.pop(future, None)
