"""A thin informer: list + watch of one resource on ``agentq.kube``, feeding the cache.

Chosen over kopf's watches by measurement (docs/benchmarks.md): kopf runs its
per-object machinery for every event -- most of the operator's CPU per dispatch
-- and decodes with ``json.loads``, so one AgentTask nested too deeply stops
it. This one does what client-go's reflector does and nothing more:

- LIST (paginated) then WATCH from the list's resourceVersion, with bookmarks,
  label selected on the server (``agentq.dev/lease in (task,worker)`` for
  Leases: node and other controllers' Leases never reach us);
- a watch the server ends (its timeout) is resumed from the last
  resourceVersion seen; ``410 Gone`` (the version was compacted) means a new
  LIST, and every object known before but missing from it is delivered as
  DELETED -- a task deleted while we were not watching does not stay a ghost;
- every line is decoded with ``agentq.views.decode`` (no ``RecursionError`` for
  any nesting) and a line that cannot be decoded at all is counted and skipped;
- ``WatchHealth`` says whether the watch is connected and current: the
  controller judges no expiry while it is not;
- a failure (no answer, a 5xx, a refusal) is retried after ``agentq.kube.Backoff``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

from agentq import views
from agentq.kube import Backoff, Client
from agentq.operator import metrics
from agentq.operator.port import Body

log = logging.getLogger("agentq.informer")

# The API server ends a watch after this (it picks a random timeout up to twice
# --min-request-timeout otherwise); resuming is cheap.
WATCH_SECONDS = 290
PAGE = 500

LIST_TIMEOUT = aiohttp.ClientTimeout(total=120, sock_connect=10)  # a page of 500 large tasks
OnEvent = Callable[[str, str, Body, int], None]  # (plural, ADDED/MODIFIED/DELETED, body, size)


class Gone(Exception):
    """The resourceVersion we resume from was compacted: list again."""


class Absent(Exception):
    """An optional resource is not served (its CRD is not installed)."""


ABSENT_RETRY_SECONDS = 60.0


class Informer:
    def __init__(
        self,
        client: Client,
        *,
        path: str,
        plural: str,
        on_event: OnEvent,
        on_synced: Callable[[], None],
        on_health: Callable[[bool], None],
        label_selector: str | None = None,
        on_heard: Callable[[], None] | None = None,
        keep: Callable[[Body], bool] | None = None,
        optional: bool = False,
    ) -> None:
        self.client = client
        # Called for every answer from the API server (a page, a watch line, a bookmark):
        # it is serving (``silence.ApiSilence.heard``).
        self.on_heard = on_heard or (lambda: None)
        self.backoff = Backoff(initial=0.2, maximum=5.0)
        self.path = path
        self.plural = plural
        self.on_event = on_event
        self.on_synced = on_synced
        self.on_health = on_health
        self.label_selector = label_selector
        # Whether to remember the object for a relist's deletions (default: all).
        self.keep: Callable[[Body], bool] = keep or (lambda body: True)
        # A resource the API server may not serve (its CRD not installed): a LIST answered
        # 404 counts as an empty list, synced, and is tried again later.
        self.optional = optional
        self.resource_version = ""
        self.known: dict[tuple[str, str], Body] = {}  # key -> a minimal body (for DELETED)
        self.relists = 0
        self.events = 0
        self.undecodable = 0

    def _params(self, **params: str) -> dict[str, str]:
        if self.label_selector:
            params["labelSelector"] = self.label_selector
        return params

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                if not self.resource_version:
                    await self._list()
                    self.on_health(True)
                    self.on_synced()
                await self._watch()
                self.backoff.reset()
            except Gone:
                log.info("watch of %s expired (410); listing again", self.plural)
                self.resource_version = ""
                self.relists += 1
            except Absent:
                # Nothing to watch (yet): an empty list as far as the controller knows.
                log.info("%s are not served (CRD not installed?); again later", self.plural)
                for key in list(self.known):
                    self._deliver("DELETED", self.known[key], 0)
                self.on_health(True)
                self.on_synced()
                self.resource_version = ""
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), ABSENT_RETRY_SECONDS)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # connection refused, reset, timeout, 5xx
                self.on_health(False)
                log.warning("watch of %s failed: %s: %s", self.plural, type(err).__name__, err)
                await self.backoff.sleep(stop)

    async def _pages(self) -> AsyncIterator[Body | None]:
        """A paginated LIST, page by page (decoded); ``None`` when the continue token
        expired mid-list and the list starts over."""
        cont = ""
        while True:
            params = {"limit": str(PAGE)}
            if cont:
                params["continue"] = cont
            rsp = await self.client.request(
                "GET", self.path, params=self._params(**params), timeout=LIST_TIMEOUT
            )
            self.on_heard()
            if rsp.status == 410:
                cont = ""
                yield None
                continue
            if rsp.status == 404 and self.optional:
                raise Absent()
            if rsp.status != 200:
                raise RuntimeError(f"LIST {self.plural}: HTTP {rsp.status}: {rsp.raw[:300]!r}")
            listed = views.decode(rsp.raw)
            yield listed
            cont = str((listed.get("metadata") or {}).get("continue") or "")
            if not cont:
                return

    def _deliver_listed(self, item: Body) -> tuple[str, str]:
        key = views.key_of(item)
        # A list's items carry no kind; the body keeps what the views read.
        self._deliver("MODIFIED" if key in self.known else "ADDED", item, 0)
        return key

    async def _list(self) -> None:
        seen: set[tuple[str, str]] = set()
        version = ""
        async for listed in self._pages():
            if listed is None:  # the list starts over: so do its version and what it saw
                seen, version = set(), ""
                continue
            if not version:
                version = str((listed.get("metadata") or {}).get("resourceVersion") or "")
            for item in listed.get("items") or []:
                seen.add(self._deliver_listed(item))
        for key in [k for k in self.known if k not in seen]:
            # Deleted while we were not watching: a relist must say so.
            self._deliver("DELETED", self.known[key], 0)
        self.resource_version = version

    async def catch_up(self) -> None:
        """A fresh LIST delivered into the cache, the watch left as it is: what the API
        server holds now reaches the controller even if the watch is behind. Older
        objects the watch delivers later are ignored by resourceVersion; a deletion is
        left to the watch. A new leader calls this before its first decision."""
        async for listed in self._pages():
            for item in (listed or {}).get("items") or []:
                self._deliver_listed(item)

    async def _watch(self) -> None:
        params = self._params(
            watch="1",
            resourceVersion=self.resource_version,
            allowWatchBookmarks="true",
            timeoutSeconds=str(WATCH_SECONDS),
        )
        async with self.client.stream(
            self.path, params=params, read_timeout=WATCH_SECONDS + 30
        ) as rsp:
            if rsp.status == 410:
                raise Gone()
            if rsp.status != 200:
                text = (await rsp.read()).decode(errors="replace")
                raise RuntimeError(f"WATCH {self.plural}: HTTP {rsp.status}: {text[:300]}")
            self.on_health(True)
            self.backoff.reset()
            async for line in rsp.lines():
                self.on_heard()
                if line.strip():
                    self._line(line)

    def _line(self, line: bytes) -> None:
        try:
            event = views.decode(line)
        except ValueError:
            self.undecodable += 1
            metrics.UNPROCESSABLE.labels(self.plural, "Undecodable").inc()
            log.error("undecodable %s watch line (%d bytes) skipped", self.plural, len(line))
            return
        kind = event.get("type")
        obj: Any = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            raise RuntimeError(f"watch error: {obj.get('message')}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        if version:
            self.resource_version = str(version)
        if kind == "BOOKMARK":
            return
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            self._deliver(kind, obj, len(line))

    def _deliver(self, kind: str, body: Body, size: int) -> None:
        self.events += 1
        key = views.key_of(body)
        if kind == "DELETED" or not self.keep(body):
            # (an object the controller keeps no record of -- a finished task -- is not
            # remembered here either: a deletion missed while not watching is found by
            # the cleanup's delete, a 404)
            self.known.pop(key, None)
        else:
            meta = body.get("metadata") or {}
            self.known[key] = {
                "metadata": {
                    "namespace": meta.get("namespace"),
                    "name": meta.get("name"),
                    "resourceVersion": meta.get("resourceVersion"),
                    "labels": meta.get("labels") or {},
                }
            }
        try:
            self.on_event(self.plural, kind, body, size)
        except Exception:  # one object must never stop the watch for every other one
            metrics.UNPROCESSABLE.labels(self.plural, "HandlerError").inc()
            log.exception("could not take in a %s event; skipped", self.plural)
