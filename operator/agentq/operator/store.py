"""The operator's in-memory mirror of the objects it watches.

Watches (kopf handlers) and the operator's own successful writes both put
objects here. An object is replaced only by a newer resourceVersion, so a late
watch event can never roll back the response of a write we already made
(resourceVersions are etcd revisions, increasing integers, on every API server
agentq supports; a non-numeric one is taken as newer). Bodies are plain dicts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

Key = tuple[str, str]  # (namespace, name)
Body = dict[str, Any]


def _rv(body: Body) -> int | None:
    raw = (body.get("metadata") or {}).get("resourceVersion")
    try:
        return int(str(raw))
    except (TypeError, ValueError):
        return None


def key_of(body: Body) -> Key:
    meta = body.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


class Kind:
    """All objects of one kind, by (namespace, name)."""

    def __init__(self) -> None:
        self._objects: dict[Key, Body] = {}
        self._deleted_rv: dict[Key, int] = {}

    def put(self, body: Body) -> bool:
        """Store ``body`` unless we hold a newer version; True if stored."""
        key = key_of(body)
        new = _rv(body)
        old_body = self._objects.get(key)
        old = _rv(old_body) if old_body is not None else self._deleted_rv.get(key)
        if new is not None and old is not None and new < old:
            return False
        self._objects[key] = body
        self._deleted_rv.pop(key, None)
        return True

    def delete(self, body: Body) -> Body | None:
        key = key_of(body)
        rv = _rv(body)
        if rv is not None:
            # Remember the tombstone's version so a late ADDED/MODIFIED cannot resurrect it.
            self._deleted_rv[key] = rv
        return self._objects.pop(key, None)

    def get(self, key: Key) -> Body | None:
        return self._objects.get(key)

    def __iter__(self) -> Iterator[Body]:
        return iter(list(self._objects.values()))

    def __len__(self) -> int:
        return len(self._objects)


class Store:
    """Tasks, workers and agentq Leases, plus a wake-up for the controller loop."""

    def __init__(self) -> None:
        self.tasks = Kind()
        self.workers = Kind()
        self.leases = Kind()
        self._changed = asyncio.Event()

    def poke(self) -> None:
        """Something changed: the controller should run a pass soon."""
        self._changed.set()

    async def wait_changed(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), timeout=max(0.0, timeout))
        self._changed.clear()

    def namespaces(self) -> set[str]:
        return {key_of(b)[0] for kind in (self.tasks, self.workers) for b in kind}
