"""Time the API server answered nothing while we waited for it is not counted against holders.

An API server that stops answering -- stopped (SIGSTOP), starved of CPU, paused
by its VM, or cut off from etcd -- keeps its TCP connections open: the watches
stay connected and silent, so ``health.WatchHealth`` calls them healthy. The
holders cannot renew their Leases meanwhile either. Without this, every claim
whose lease is shorter than the silence expires on the operator's clock, and
when the API server answers again the confirming read of the Lease
(``confirm.ExpiryConfirmer``) may be served before the holder's renewal that
waited in the same queue: a healthy claim is reclaimed (measured: a 6.5 s
SIGSTOP of kube-apiserver reclaimed 3 of 6 healthy 5 s claims).

So every request the operator makes goes through ``HeardKube``, and every line
its watches receive is ``heard``: ``ApiSilence`` keeps the time since which a
request of ours has been waiting with nothing at all heard from the API server.
When something is heard again after at least ``API_SILENCE_SECONDS`` of that,
the silence is given back to every Lease (``Controller.note_api_silence``, as
for a stop of the operator itself) before the reply is handed on, so the
expiry decision whose confirming read waited through it sees the time given
back and is decided again instead of committed.

A slow but serving API server is not silent: with requests in flight, replies
and watch events keep arriving, and only a stretch with none at all counts. A
request that ends without being served (a timeout, a refused connection, a 5xx
or 429: ``KubeError``) leaves the silence open until something is heard. The
silence counts from the first request that waited through it: in the operator
the elector's request goes out every 2 s, and with leader election off
``pulse`` reads a Lease every 2 s for the same purpose, so a stopped API server
is noticed from about when it stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from agentq.clock import Clock
from agentq.operator.port import Body, Kube, KubeError, Reply


class ApiSilence:
    """When the API server last answered while we waited (see the module docstring)."""

    def __init__(self, clock: Clock, threshold: float) -> None:
        self.clock = clock
        self.threshold = threshold
        self.waiting = 0  # requests out without a reply
        self.since: float | None = None  # nothing heard since then while we waited
        self._listeners: list[Callable[[float], None]] = []

    def listen(self, listener: Callable[[float], None]) -> None:
        """``listener(seconds)`` is called for every silence that ends."""
        self._listeners.append(listener)

    def sent(self) -> None:
        self.waiting += 1
        if self.since is None:
            self.since = self.clock.monotonic()

    def answered(self) -> None:
        """A reply came (any HTTP status: the API server is serving)."""
        self.waiting = max(0, self.waiting - 1)
        self.heard()

    def unanswered(self) -> None:
        """A request ended without a reply: the silence, if any, goes on."""
        self.waiting = max(0, self.waiting - 1)

    def heard(self) -> None:
        """Something came from the API server (a reply, a watch line)."""
        if self.since is None:
            return
        now = self.clock.monotonic()
        silent = now - self.since
        self.since = now if self.waiting else None  # a silence never counts twice
        if silent >= self.threshold:
            for listener in self._listeners:
                listener(silent)


class HeardKube:
    """A ``Kube`` port whose every call is timed by an ``ApiSilence``."""

    def __init__(self, inner: Kube, silence: ApiSilence) -> None:
        self.inner = inner
        self.silence = silence

    async def _timed(self, call: Awaitable[Reply]) -> Reply:
        self.silence.sent()
        try:
            reply = await call
        except KubeError as err:
            if served(err.code):
                self.silence.answered()  # refused (401, 403, ...), but by a serving server
            else:
                self.silence.unanswered()
            raise
        except BaseException:
            self.silence.unanswered()
            raise
        self.silence.answered()
        return reply

    async def patch_status(
        self, plural: str, namespace: str, name: str, resource_version: str | None, patch: Body
    ) -> Reply:
        return await self._timed(
            self.inner.patch_status(plural, namespace, name, resource_version, patch)
        )

    async def create_lease(self, namespace: str, body: Body) -> Reply:
        return await self._timed(self.inner.create_lease(namespace, body))

    async def replace_lease(self, namespace: str, name: str, body: Body) -> Reply:
        return await self._timed(self.inner.replace_lease(namespace, name, body))

    async def patch_lease(
        self, namespace: str, name: str, resource_version: str, patch: Body
    ) -> Reply:
        return await self._timed(self.inner.patch_lease(namespace, name, resource_version, patch))

    async def delete_lease(self, namespace: str, name: str, resource_version: str | None) -> Reply:
        return await self._timed(self.inner.delete_lease(namespace, name, resource_version))

    async def delete_task(
        self, namespace: str, name: str, uid: str, resource_version: str
    ) -> Reply:
        return await self._timed(self.inner.delete_task(namespace, name, uid, resource_version))

    async def get_lease(self, namespace: str, name: str) -> Reply:
        return await self._timed(self.inner.get_lease(namespace, name))

    async def get_task(self, namespace: str, name: str) -> Reply:
        return await self._timed(self.inner.get_task(namespace, name))

    async def list_leases(self, namespace: str, label_selector: str) -> Reply:
        return await self._timed(self.inner.list_leases(namespace, label_selector))

    async def create_event(self, namespace: str, body: Body) -> Reply:
        return await self._timed(self.inner.create_event(namespace, body))

    async def close(self) -> None:
        await self.inner.close()


def served(code: int | None) -> bool:
    """Whether an HTTP status says the API server served the request: not a 5xx (it
    could not, e.g. etcd is away) nor a 429 (it would not, and the holders' renewals
    are throttled alike)."""
    return code is not None and 100 <= code < 500 and code != 429


async def pulse(
    kube: Kube, namespace: str, name: str, stop: asyncio.Event, period: float = 2.0
) -> None:
    """Read one Lease every ``period`` until ``stop`` (a 404 is as good an answer): with
    leader election off nothing else asks the API server regularly, and a silence
    counts only from the first request that waited through it."""
    while not stop.is_set():
        with contextlib.suppress(Exception):
            await kube.get_lease(namespace, name)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=period)


__all__ = ["ApiSilence", "HeardKube", "pulse", "served"]
