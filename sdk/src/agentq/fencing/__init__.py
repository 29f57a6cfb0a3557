"""Fenced sinks: stores that refuse a write carrying a lower fencing token than one
they have already seen for the same key (docs/fencing.md).

    from agentq.fencing import open_store, StaleTokenError

    with open_store("sqlite:///var/lib/agent/results.db") as store:
        store.fence(task, token)                  # claim the key when the attempt starts
        ...                                       # work
        store.write(task, token, {"answer": 42})  # refused if a newer attempt came by

Each backend keeps the highest token next to the data and checks and raises it
in the same transaction as the write:

- ``SQLiteFencedStore``   (standard library; ``sqlite:///path`` or ``sqlite://relative``)
- ``PostgresFencedStore`` (psycopg 3, the ``postgres`` extra; ``postgresql://...``)
- ``ConfigMapFencedStore`` (a Kubernetes ConfigMap, resourceVersion compare-and-swap;
  ``configmap://namespace/name``)
"""

from __future__ import annotations

from agentq.fencing.base import FencedStore, Record, StaleTokenError, check_token
from agentq.fencing.sqlite import SQLiteFencedStore

__all__ = [
    "FencedStore",
    "Record",
    "SQLiteFencedStore",
    "StaleTokenError",
    "check_token",
    "open_store",
]


def open_store(url: str, **options: object) -> FencedStore:
    """A store from a URL: ``sqlite:///abs/path``, ``postgresql://...``,
    ``configmap://namespace/name``."""
    if url.startswith("sqlite://"):
        path = url[len("sqlite://") :]
        if not path:
            raise ValueError(f"{url!r}: no database path (sqlite:///absolute/path)")
        return SQLiteFencedStore(path, **options)  # type: ignore[arg-type]
    if url.startswith(("postgresql://", "postgres://")):
        from agentq.fencing.postgres import PostgresFencedStore

        return PostgresFencedStore(url, **options)  # type: ignore[arg-type]
    if url.startswith("configmap://"):
        from agentq.fencing.configmap import ConfigMapFencedStore

        namespace, _, name = url[len("configmap://") :].partition("/")
        if not namespace or not name:
            raise ValueError(f"{url!r}: expected configmap://NAMESPACE/NAME")
        return ConfigMapFencedStore(name=name, namespace=namespace, **options)  # type: ignore[arg-type]
    raise ValueError(
        f"unknown fenced store URL {url!r}: use sqlite:///path, postgresql://... or "
        "configmap://namespace/name"
    )
