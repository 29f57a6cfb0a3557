"""A wake-up shared by the sidecar's loops: "something about the attempts changed".

The watcher, the HTTP handlers and the writes call ``notify``; the renewal loop
and the agent's long-polls ``wait`` on it (with a timeout, so a missed wake-up
costs at most one timeout).
"""

from __future__ import annotations

import asyncio
import contextlib


class Changes:
    def __init__(self) -> None:
        self._event = asyncio.Event()

    def notify(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait(self, timeout: float) -> bool:
        """Wait for the next ``notify`` (True) or ``timeout`` seconds (False)."""
        event = self._event
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout=max(0.0, timeout))
            return True
        return False
