"""The operator's narrow port to the API server: the nine calls it makes, as a Protocol.

Like client-go's ``resourcelock.Interface`` and httpx's transport, this is the
single seam between the controller's logic and the network: the production
implementation is ``agentq.operator.rest.RestKube`` (on ``agentq.kube``, the
one client of operator, sidecar and CLI), and the unit tests drive the whole
controller loop against ``agentq.operator.fake.FakeKube`` with injected
conflicts, 404s, refusals and timeouts.

Bodies are plain JSON dicts as the API server sends them. A reply says how a
write ended in the terms the controller decides by (``Status``): done,
conflict, gone, invalid, or forbidden -- refused for who we are (a 401 that a
refreshed credential did not cure, a 403, or no credential to be had): nothing
happened, and retrying the same request will not help until RBAC or the
credentials change. Anything else -- a timeout, a dropped connection, a 5xx, a
429 -- raises ``KubeError``: the outcome is unknown, so the controller drops
its decision and decides again from what its watches show next.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Protocol

Body = dict[str, Any]


class Status(enum.Enum):
    OK = "ok"
    CONFLICT = "conflict"  # 409: the resourceVersion changed, or (create) it exists already
    GONE = "gone"  # 404
    # 400 / 413 / 422, or etcd's "request is too large": this write can never succeed as
    # it is. The controller turns it into a visible state instead of retrying forever.
    INVALID = "invalid"
    # 401 after the credential was refreshed, 403, or no credential could be had: refused
    # for who we are, nothing happened. A known outcome, never retried as an unknown one:
    # the controller retries it slowly (REFUSED_SECONDS) and says so loudly.
    FORBIDDEN = "forbidden"


@dataclass(frozen=True, slots=True)
class Reply:
    status: Status
    body: Body | None = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status is Status.OK


class KubeError(RuntimeError):
    """A call whose outcome is unknown (timeout, connection lost, 5xx, throttled).

    ``code``: the HTTP status when the API server answered at all (None for a timeout or
    a lost connection)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class NotLeading(KubeError):
    """A decision's call was not sent: this replica may no longer lead (its outcome is
    known: nothing happened; the leader of the moment decides again)."""


class Kube(Protocol):
    """Every API call the operator makes (reads of its watches aside)."""

    async def patch_status(
        self, plural: str, namespace: str, name: str, resource_version: str | None, patch: Body
    ) -> Reply:
        """JSON-merge ``patch`` into the object's status; a CAS when ``resource_version``
        is given. ``namespace`` "": a cluster-scoped object (an AgentQueue). OK carries
        the updated object."""
        ...

    async def create_lease(self, namespace: str, body: Body) -> Reply:
        """CONFLICT: a Lease of that name exists."""
        ...

    async def replace_lease(self, namespace: str, name: str, body: Body) -> Reply:
        """A CAS on ``body.metadata.resourceVersion``."""
        ...

    async def patch_lease(
        self, namespace: str, name: str, resource_version: str, patch: Body
    ) -> Reply:
        """JSON-merge ``patch`` into the Lease, a CAS on ``resource_version``."""
        ...

    async def delete_lease(self, namespace: str, name: str, resource_version: str | None) -> Reply:
        """A CAS delete when ``resource_version`` is given."""
        ...

    async def delete_task(
        self, namespace: str, name: str, uid: str, resource_version: str
    ) -> Reply:
        """Delete an AgentTask: this object (``uid``), as it was (``resource_version``)."""
        ...

    async def get_lease(self, namespace: str, name: str) -> Reply:
        """A quorum read (the API server's default): newer than any watch event."""
        ...

    async def get_task(self, namespace: str, name: str) -> Reply:
        """A quorum read of an AgentTask (GONE: there is none of that name)."""
        ...

    async def list_leases(self, namespace: str, label_selector: str) -> Reply:
        """OK carries the list (``items``, ``metadata.resourceVersion``)."""
        ...

    async def create_event(self, namespace: str, body: Body) -> Reply: ...

    async def close(self) -> None: ...


# -- paths shared by the HTTP implementations ------------------------------------------


def object_path(group: str, version: str, namespace: str, plural: str, name: str = "") -> str:
    """The path of an object (or of its collection); ``namespace`` "": cluster-scoped."""
    base = "/api/v1" if not group else f"/apis/{group}/{version}"
    path = f"{base}/namespaces/{namespace}/{plural}" if namespace else f"{base}/{plural}"
    return f"{path}/{name}" if name else path


def lease_path(namespace: str, name: str = "") -> str:
    return object_path("coordination.k8s.io", "v1", namespace, "leases", name)


def reply_for(code: int, body: Any, text: str) -> Reply:
    """Map an HTTP status to a ``Reply``, or raise ``KubeError`` for an unknown outcome."""
    if 200 <= code < 300:
        return Reply(Status.OK, body if isinstance(body, dict) else None)
    message = text[:2000]
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        message = body["message"][:2000]
    if code == 409:
        return Reply(Status.CONFLICT, None, message)
    if code == 404:
        return Reply(Status.GONE, None, message)
    if code in (400, 413, 422) or "too large" in message:
        return Reply(Status.INVALID, None, message)
    if code in (401, 403):
        return Reply(Status.FORBIDDEN, None, f"HTTP {code}: {message}")
    raise KubeError(f"HTTP {code}: {message}", code)
