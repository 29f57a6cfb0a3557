"""kopf's watches (``--watcher kopf``) held to the informer's guarantees: health and synced.

kopf announces neither whether a watch is connected nor when its first lists
have been delivered, and the controller needs both: it judges no expiry while
a watch is down (``health.WatchHealth``), and decides nothing before its cache
holds what the API server holds (``Controller.set_synced``). Two pieces:

- ``KopfWatchHealth`` wraps kopf's one request function
  (``kopf._cogs.clients.api.request``: every LIST and WATCH of kopf's watchers
  goes through it) for the GETs of our three resources: each is sent once
  (kopf's own retries hide a down API server for up to 54 s), a failure marks
  that resource's watch unhealthy and is retried after ``agentq.kube.Backoff``
  until it is answered; an answered WATCH marks it healthy. Other requests
  pass untouched. kopf is pinned (pyproject.toml); ``check_kopf()`` fails
  loudly if the function's shape changes.
- the same hook decodes what kopf reads of those resources with
  ``agentq.views.decode`` (kopf's ``json.loads`` raises ``RecursionError`` on
  a deeply nested object, and kopf deep-copies every body it handles): an
  object nested deeper than ``KOPF_MAX_DEPTH`` is handed to the controller
  directly (which fails such a task, PayloadTooDeep) and kopf sees a BOOKMARK
  carrying its resourceVersion in its place, so one object can neither stop
  kopf's watch nor stay unseen;
- ``SyncSignal`` makes "synced" a fact instead of a 3 s guess: once kopf runs,
  a metadata-only LIST of each watched collection says what the API server
  holds; the controller is synced when kopf's handlers have fed it every one
  of those objects at that version or newer (or its deletion). Objects deleted
  before kopf listed them are dropped by listing again every
  ``RELIST_SECONDS`` until synced.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import types
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from agentq import protocol, views
from agentq.kube import Backoff, Client
from agentq.operator.health import WatchHealth
from agentq.operator.informer import LIST_TIMEOUT
from agentq.operator.port import Body

log = logging.getLogger("agentq.kopfwatch")

RELIST_SECONDS = 2.0
# Deeper than any task the controller grants (its payload at most MAX_JSON_DEPTH, two
# levels down) and well within what kopf's deepcopy of a body survives (~400 levels).
KOPF_MAX_DEPTH = protocol.MAX_JSON_DEPTH + 8
KIND_PLURALS = {"AgentTask": "agenttasks", "AgentWorker": "agentworkers", "Lease": "leases"}
Feed = Callable[[str, str, Body, int], None]  # (plural, kind, body, size)
METADATA_LIST = "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json"
Key = tuple[str, str, str]  # plural, namespace, name


@dataclass(frozen=True)
class Target:
    """One watched collection: ``path`` (a namespace's or all), its label selector."""

    plural: str
    namespace: str | None
    path: str
    selector: str | None = None


def _version(body: Body) -> float:
    raw = str((body.get("metadata") or {}).get("resourceVersion") or "")
    # etcd revisions; a version that is not one compares as "any event will do".
    return float(raw) if raw.isdigit() else 0.0


def _target_of(
    method: str, url: str, plurals: Sequence[str]
) -> tuple[str, str | None, bool] | None:
    """(plural, namespace, is a watch) for a GET of one of our collections, else None."""
    if method.lower() != "get":
        return None
    parts = urllib.parse.urlsplit(url)
    segments = [s for s in parts.path.split("/") if s]
    if not segments or segments[-1] not in plurals or segments[0] not in ("api", "apis"):
        return None
    namespace = None
    if "namespaces" in segments[:-1]:
        at = segments.index("namespaces")
        namespace = segments[at + 1] if at + 2 < len(segments) else None
    query = urllib.parse.parse_qs(parts.query)
    return segments[-1], namespace, query.get("watch", [""])[0] in ("true", "1")


def check_kopf() -> Any:
    """kopf's request function, checked to be what this module wraps."""
    from kopf._cogs.clients import api

    params = inspect.signature(api.request).parameters
    if not {"method", "url", "backoffs"} <= set(params):
        raise RuntimeError(
            "kopf._cogs.clients.api.request changed shape: the kopf watcher's health hook "
            "needs updating (agentq.operator.kopfwatch)"
        )
    return api


class KopfWatchHealth:
    """Reports kopf's watches of our resources to ``health``, and hands objects too deep
    for kopf to ``feed`` (see the module docstring)."""

    def __init__(
        self,
        health: WatchHealth,
        plurals: Sequence[str],
        namespaces: Sequence[str | None],
        feed: Feed | None = None,
    ) -> None:
        self.health = health
        self.plurals = tuple(plurals)
        self.namespaces = list(namespaces)
        self.healthy: dict[str, set[str | None]] = {p: set() for p in plurals}
        self.failures = 0
        self.feed = feed
        self.bypassed = 0  # objects handed to the controller past kopf

    def _too_deep(self, body: Any) -> bool:
        depth = protocol.json_depth(body, limit=KOPF_MAX_DEPTH)
        return isinstance(body, dict) and depth > KOPF_MAX_DEPTH

    def loads(self, text: str | bytes) -> Any:
        """kopf's ``json.loads`` for watch lines: any depth; too deep goes past kopf."""
        event = views.decode(text)
        kinds = ("ADDED", "MODIFIED", "DELETED")
        if not isinstance(event, dict) or event.get("type") not in kinds:
            return event
        body = event.get("object")
        plural = KIND_PLURALS.get(str((body or {}).get("kind")))
        if self.feed is None or plural not in self.plurals or not self._too_deep(body):
            return event
        assert plural is not None and isinstance(body, dict)
        self.bypassed += 1
        self.feed(plural, str(event["type"]), body, len(text))
        version = (body.get("metadata") or {}).get("resourceVersion")
        return {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": version}}}

    def listed(self, raw: bytes, plural: str) -> Any:
        """A LIST page as kopf reads it: any depth; items too deep go past kopf."""
        page = views.decode(raw)
        if self.feed is None or not isinstance(page, dict):
            return page
        kept = []
        for item in page.get("items") or []:
            if self._too_deep(item):
                self.bypassed += 1
                self.feed(plural, "MODIFIED", item, 0)
            else:
                kept.append(item)
        page["items"] = kept
        return page

    def report(self, plural: str, namespace: str | None, ok: bool) -> None:
        (self.healthy[plural].add if ok else self.healthy[plural].discard)(namespace)
        self.health.set(plural, len(self.healthy[plural]) == len(self.namespaces))

    def wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        from kopf._cogs.clients import errors

        retried = (
            OSError,  # aiohttp's connection errors are OSErrors too
            TimeoutError,
            errors.APIServerError,
            errors.APIForbiddenError,
            errors.APITooManyRequestsError,
        )

        async def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            import aiohttp

            target = _target_of(method, url, self.plurals)
            if target is None:
                return await original(method, url, *args, **kwargs)
            plural, namespace, watch = target
            backoff = Backoff(initial=0.2, maximum=5.0)
            while True:
                try:
                    response = await original(method, url, *args, **{**kwargs, "backoffs": ()})
                except (*retried, aiohttp.ClientError) as err:
                    self.failures += 1
                    self.report(plural, namespace, False)
                    log.warning(
                        "kopf's watch of %s failed: %s: %s", plural, type(err).__name__, err
                    )
                    await backoff.sleep()
                    continue
                if watch:
                    self.report(plural, namespace, True)
                else:  # a LIST page, read with response.json(): decoded as ``listed``
                    self._decode_as_listed(response, plural)
                return response

        return request

    def _decode_as_listed(self, response: Any, plural: str) -> None:
        read = response.read

        async def json(*_: Any, **__: Any) -> Any:
            return self.listed(await read(), plural)

        response.json = json

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """kopf's request function wrapped for as long as the block runs."""
        api = check_kopf()
        original, original_json = api.request, api.json
        api.request = self.wrap(original)
        # api.stream decodes each watch line with its module's json.loads
        api.json = types.SimpleNamespace(loads=self.loads, dumps=original_json.dumps)
        try:
            yield
        finally:
            api.request, api.json = original, original_json


class SyncSignal:
    """Calls ``on_synced`` once kopf has fed the controller all the API server held."""

    def __init__(
        self, client: Client, targets: Sequence[Target], on_synced: Callable[[], None]
    ) -> None:
        self.client = client
        self.targets = list(targets)
        self.on_synced = on_synced
        self.synced = False
        self.fed: dict[Key, float] = {}  # newest version fed per object (inf: deleted)
        self.pending: dict[Key, float] | None = None  # None: not listed yet
        self.lists = 0
        self._progress = asyncio.Event()

    def note(self, plural: str, kind: str, body: Body) -> None:
        """kopf's handler fed ``body`` to the controller."""
        if self.synced:
            return
        meta = body.get("metadata") or {}
        key = (plural, str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        version = math.inf if kind == "DELETED" else _version(body)
        self.fed[key] = max(self.fed.get(key, -1.0), version)
        if self.pending is not None and key in self.pending and self._covered(key):
            del self.pending[key]
            self._progress.set()

    def _covered(self, key: Key) -> bool:
        assert self.pending is not None
        return self.fed.get(key, -1.0) >= self.pending[key]

    async def _listed(self) -> dict[Key, float]:
        held: dict[Key, float] = {}
        for target in self.targets:
            cont = ""
            while True:
                params = {"limit": "500"}
                if target.selector:
                    params["labelSelector"] = target.selector
                if cont:
                    params["continue"] = cont
                rsp = await self.client.request(
                    "GET", target.path, params=params, accept=METADATA_LIST, timeout=LIST_TIMEOUT
                )
                if rsp.status == 410:  # the continue token expired: this collection again
                    held = {k: v for k, v in held.items() if k[0] != target.plural}
                    cont = ""
                    continue
                if rsp.status != 200:
                    raise RuntimeError(f"LIST {target.path}: HTTP {rsp.status}")
                listed = views.decode(rsp.raw)
                for item in listed.get("items") or []:
                    meta = item.get("metadata") or {}
                    key = (target.plural, str(meta.get("namespace") or ""), str(meta.get("name")))
                    held[key] = _version(item)
                cont = str((listed.get("metadata") or {}).get("continue") or "")
                if not cont:
                    break
        self.lists += 1
        return held

    async def run(self) -> None:
        """List, then wait until kopf has fed everything listed; list again meanwhile
        (an object deleted before kopf listed it is never fed)."""
        backoff = Backoff(initial=0.2, maximum=5.0)
        while True:
            try:
                held = await self._listed()
            except Exception as err:  # the API server is away: no synced before it is back
                log.warning("kopf watcher: cannot list to check the first sync: %s", err)
                await backoff.sleep()
                continue
            if self.pending is None:
                self.pending = held
            else:  # gone since: never fed; still there: the version first listed will do
                self.pending = {k: v for k, v in self.pending.items() if k in held}
            self.pending = {k: v for k, v in self.pending.items() if not self._covered(k)}
            deadline = asyncio.get_running_loop().time() + RELIST_SECONDS
            while self.pending:
                self._progress.clear()
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._progress.wait(), left)
            if not self.pending:
                break
            log.info("kopf watcher: %d listed objects not fed yet", len(self.pending))
        self.synced = True
        self.fed.clear()
        log.info("kopf watcher: synced (%d list(s))", self.lists)
        self.on_synced()


async def catch_up(client: Client, path: str, feed: Callable[[Body], None]) -> None:
    """A fresh LIST of ``path`` fed to the controller (a new leader's first read),
    as ``Informer.catch_up`` does in the default mode."""
    cont = ""
    while True:
        params = {"limit": "500"}
        if cont:
            params["continue"] = cont
        rsp = await client.request("GET", path, params=params, timeout=LIST_TIMEOUT)
        if rsp.status == 410:
            cont = ""
            continue
        if rsp.status != 200:
            raise RuntimeError(f"LIST {path}: HTTP {rsp.status}")
        listed = views.decode(rsp.raw)
        for item in listed.get("items") or []:
            feed(item)
        cont = str((listed.get("metadata") or {}).get("continue") or "")
        if not cont:
            return


__all__ = ["KopfWatchHealth", "SyncSignal", "Target", "catch_up", "check_kopf"]
