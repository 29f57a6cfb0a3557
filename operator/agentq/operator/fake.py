"""An in-memory API server behind the ``Kube`` port, for unit tests of the controller loop.

``FakeKube`` keeps AgentTasks, AgentWorkers, Leases and Events as JSON dicts
with a cluster-wide resourceVersion counter, and implements the port with the
API server's semantics that the controller relies on: compare-and-swap on
``resourceVersion`` (409), 404 for what is gone, JSON merge patch of status.
Every change is also a watch event, delivered to the subscribers either at
once or, with ``hold_events()``, when the test calls ``deliver()`` -- a stalled
watch.

Faults are injected per call: ``inject("patch_status", Status.CONFLICT)``
answers the next status patch with a 409 as if someone wrote first;
``inject("create_lease", KubeError("timeout"), applied=True)`` applies the write
and then loses the reply (the outcome the controller must treat as unknown).
``max_object_bytes`` plays etcd's request limit: a status patch whose result is
longer as JSON is refused as the API server refuses it ("request is too large").

Not a test double of Kubernetes in general: only what the operator uses.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentq.operator.port import Body, KubeError, Reply, Status
from agentq.protocol import task_lease_name

Subscriber = Callable[[str, str, Body], None]  # (plural, event type, object)
_PLURALS = ("agenttasks", "agentworkers", "leases", "events")


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class Hang(Exception):
    """As an injected outcome: the call never returns (until it is cancelled)."""


class Held(Exception):
    """As an injected outcome: the call waits until ``gate`` is set, then is made as usual
    (a slow request: a later call may overtake it at the API server)."""

    def __init__(self, gate: asyncio.Event) -> None:
        super().__init__("held")
        self.gate = gate


@dataclass
class _Fault:
    method: str
    outcome: Status | BaseException
    applied: bool
    when: Callable[[tuple[Any, ...]], bool] | None
    times: int


def _matches(selector: str, labels: dict[str, str]) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


class FakeKube:
    """``agentq.operator.port.Kube`` in memory (see the module docstring)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], Body] = {}
        self._rv = itertools.count(100)
        self._subscribers: list[Subscriber] = []
        self._held: list[tuple[str, str, Body]] | None = None
        self._faults: list[_Fault] = []
        self.calls: Counter[str] = Counter()
        self.writes: Counter[str] = Counter()
        # etcd's request limit, as the length of the object's JSON (None: no limit).
        self.max_object_bytes: int | None = None

    # -- watch side ----------------------------------------------------------------------

    def subscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.append(subscriber)

    def hold_events(self) -> None:
        """Queue watch events until ``deliver()``: the watch stalls."""
        if self._held is None:
            self._held = []

    def deliver(self) -> int:
        """Deliver the queued events (and stop holding); returns how many."""
        held, self._held = self._held or [], None
        for event in held:
            self._emit(*event)
        return len(held)

    def _emit(self, plural: str, kind: str, body: Body) -> None:
        if self._held is not None:
            self._held.append((plural, kind, body))
            return
        for subscriber in self._subscribers:
            subscriber(plural, kind, copy.deepcopy(body))

    def _stamp(self, plural: str, body: Body, event: str) -> Body:
        body.setdefault("metadata", {})["resourceVersion"] = str(next(self._rv))
        self._emit(plural, event, body)
        return copy.deepcopy(body)

    # -- what tests (users, holders) do, bypassing faults --------------------------------

    def put(self, plural: str, body: Body) -> Body:
        """Create or replace an object as a user would (no CAS, no faults)."""
        body = copy.deepcopy(body)
        meta = body.setdefault("metadata", {})
        key = (plural, meta.get("namespace", "default"), meta["name"])
        meta.setdefault("namespace", key[1])
        old = self.objects.get(key)
        if old is None:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", f"2026-01-01T00:00:{len(self.objects):02d}Z")
            if plural == "agenttasks":
                body.setdefault("status", {"phase": "Pending"})  # the CRD's default
        else:
            meta["uid"] = old["metadata"]["uid"]
            meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            if "status" not in body and "status" in old:
                body["status"] = old["status"]
        self.objects[key] = body
        return self._stamp(plural, body, "ADDED" if old is None else "MODIFIED")

    def edit(self, plural: str, namespace: str, name: str, change: Callable[[Body], None]) -> Body:
        """Change an object in place as someone else would (a holder, a person)."""
        body = self.objects[(plural, namespace, name)]
        change(body)
        return self._stamp(plural, body, "MODIFIED")

    def remove(self, plural: str, namespace: str, name: str) -> Body:
        """Delete an object; returns its last state. Its DELETED event carries a new
        resourceVersion, the deletion's, as the API server's does."""
        body = self.objects.pop((plural, namespace, name))
        return self._stamp(plural, body, "DELETED")

    def get(self, plural: str, namespace: str, name: str) -> Body | None:
        found = self.objects.get((plural, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def events(self, name: str | None = None) -> list[Body]:
        return [
            b
            for (p, _, _), b in self.objects.items()
            if p == "events" and (name is None or b["involvedObject"]["name"] == name)
        ]

    def reasons(self, name: str) -> list[str]:
        return [e["reason"] for e in self.events(name)]

    # -- faults --------------------------------------------------------------------------

    def inject(
        self,
        method: str,
        outcome: Status | BaseException,
        *,
        times: int = 1,
        applied: bool = False,
        when: Callable[[tuple[Any, ...]], bool] | None = None,
    ) -> None:
        """Answer the next ``times`` calls of ``method`` (matching ``when(args)``) with
        ``outcome``: a ``Status`` instead of doing the call, or an exception raised
        after doing it (``applied=True``: the write happened, its reply was lost)."""
        self._faults.append(_Fault(method, outcome, applied, when, times))

    def _fault(self, method: str, args: tuple[Any, ...]) -> _Fault | None:
        self.calls[method] += 1
        for fault in self._faults:
            if fault.method == method and (fault.when is None or fault.when(args)):
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    async def _run(self, method: str, args: tuple[Any, ...], do: Callable[[], Reply]) -> Reply:
        fault = self._fault(method, args)
        if fault is None:
            return do()
        if isinstance(fault.outcome, Status):
            return Reply(fault.outcome, None, f"injected {fault.outcome.value}")
        if isinstance(fault.outcome, Hang):
            await asyncio.Event().wait()  # until cancelled
        if isinstance(fault.outcome, Held):
            await fault.outcome.gate.wait()
            return do()
        if fault.applied:
            do()
        raise fault.outcome

    # -- the port ------------------------------------------------------------------------

    async def patch_status(
        self, plural: str, namespace: str, name: str, resource_version: str | None, patch: Body
    ) -> Reply:
        def do() -> Reply:
            body = self.objects.get((plural, namespace, name))
            if body is None:
                return Reply(Status.GONE, None, "not found")
            if resource_version is not None and body["metadata"]["resourceVersion"] != str(
                resource_version
            ):
                return Reply(Status.CONFLICT, None, "the object has been modified")
            status = merge_patch(copy.deepcopy(body.get("status") or {}), patch)
            if self.max_object_bytes is not None:
                size = len(json.dumps({**body, "status": status}, separators=(",", ":")))
                if size > self.max_object_bytes:
                    return Reply(Status.INVALID, None, "etcdserver: request is too large")
            self.writes[f"{plural}/status PATCH"] += 1
            body["status"] = status
            return Reply(Status.OK, self._stamp(plural, body, "MODIFIED"))

        return await self._run("patch_status", (plural, namespace, name, patch), do)

    async def create_lease(self, namespace: str, body: Body) -> Reply:
        def do() -> Reply:
            key = ("leases", namespace, body["metadata"]["name"])
            if key in self.objects:
                return Reply(Status.CONFLICT, None, "already exists")
            self.writes["leases POST"] += 1
            stored = copy.deepcopy(body)
            stored["metadata"]["namespace"] = namespace
            stored["metadata"].setdefault("uid", str(uuid.uuid4()))
            self.objects[key] = stored
            return Reply(Status.OK, self._stamp("leases", stored, "ADDED"))

        return await self._run("create_lease", (namespace, body), do)

    async def replace_lease(self, namespace: str, name: str, body: Body) -> Reply:
        def do() -> Reply:
            key = ("leases", namespace, name)
            old = self.objects.get(key)
            if old is None:
                return Reply(Status.GONE, None, "not found")
            if body["metadata"].get("resourceVersion") != old["metadata"]["resourceVersion"]:
                return Reply(Status.CONFLICT, None, "the object has been modified")
            self.writes["leases PUT"] += 1
            stored = copy.deepcopy(body)
            stored["metadata"]["namespace"] = namespace
            stored["metadata"]["uid"] = old["metadata"]["uid"]
            self.objects[key] = stored
            return Reply(Status.OK, self._stamp("leases", stored, "MODIFIED"))

        return await self._run("replace_lease", (namespace, name, body), do)

    async def patch_lease(
        self, namespace: str, name: str, resource_version: str, patch: Body
    ) -> Reply:
        def do() -> Reply:
            key = ("leases", namespace, name)
            old = self.objects.get(key)
            if old is None:
                return Reply(Status.GONE, None, "not found")
            if old["metadata"]["resourceVersion"] != resource_version:
                return Reply(Status.CONFLICT, None, "the object has been modified")
            self.writes["leases PATCH"] += 1
            self.objects[key] = merge_patch(old, patch)
            return Reply(Status.OK, self._stamp("leases", self.objects[key], "MODIFIED"))

        return await self._run("patch_lease", (namespace, name, resource_version, patch), do)

    async def delete_lease(self, namespace: str, name: str, resource_version: str | None) -> Reply:
        def do() -> Reply:
            key = ("leases", namespace, name)
            old = self.objects.get(key)
            if old is None:
                return Reply(Status.GONE, None, "not found")
            if resource_version is not None and old["metadata"]["resourceVersion"] != str(
                resource_version
            ):
                return Reply(Status.CONFLICT, None, "precondition failed")
            self.writes["leases DELETE"] += 1
            del self.objects[key]
            self._stamp("leases", old, "DELETED")
            return Reply(Status.OK, None)

        return await self._run("delete_lease", (namespace, name, resource_version), do)

    async def delete_task(
        self, namespace: str, name: str, uid: str, resource_version: str
    ) -> Reply:
        def do() -> Reply:
            key = ("agenttasks", namespace, name)
            old = self.objects.get(key)
            if old is None:
                return Reply(Status.GONE, None, "not found")
            meta = old["metadata"]
            if meta.get("uid") != uid or meta["resourceVersion"] != resource_version:
                return Reply(Status.CONFLICT, None, "precondition failed")
            self.writes["agenttasks DELETE"] += 1
            self.remove("agenttasks", namespace, name)
            lease = self.objects.get(("leases", namespace, task_lease_name(name)))
            owners = (lease or {}).get("metadata", {}).get("ownerReferences") or []
            if any(owner.get("uid") == uid for owner in owners):
                self.remove("leases", namespace, task_lease_name(name))  # the collector
            return Reply(Status.OK, None)

        return await self._run("delete_task", (namespace, name, uid, resource_version), do)

    async def get_lease(self, namespace: str, name: str) -> Reply:
        def do() -> Reply:
            found = self.get("leases", namespace, name)
            return Reply(Status.OK, found) if found else Reply(Status.GONE, None, "not found")

        return await self._run("get_lease", (namespace, name), do)

    async def get_task(self, namespace: str, name: str) -> Reply:
        def do() -> Reply:
            found = self.get("agenttasks", namespace, name)
            return Reply(Status.OK, found) if found else Reply(Status.GONE, None, "not found")

        return await self._run("get_task", (namespace, name), do)

    async def list_leases(self, namespace: str, label_selector: str) -> Reply:
        def do() -> Reply:
            items = [
                copy.deepcopy(b)
                for (p, ns, _), b in self.objects.items()
                if p == "leases"
                and ns == namespace
                and _matches(label_selector, b["metadata"].get("labels") or {})
            ]
            return Reply(Status.OK, {"items": items, "metadata": {"resourceVersion": "0"}})

        return await self._run("list_leases", (namespace, label_selector), do)

    async def create_event(self, namespace: str, body: Body) -> Reply:
        def do() -> Reply:
            self.writes["events POST"] += 1
            stored = copy.deepcopy(body)
            name = f"{stored['metadata'].get('generateName', 'event.')}{next(self._rv)}"
            stored["metadata"] = {"name": name, "namespace": namespace}
            self.objects[("events", namespace, name)] = stored
            return Reply(Status.OK, stored)

        return await self._run("create_event", (namespace, body), do)

    async def close(self) -> None:
        return None


__all__ = ["FakeKube", "Hang", "Held", "KubeError", "merge_patch"]
