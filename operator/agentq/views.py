"""Typed, compact views of the objects the operator watches, built from the models.

The operator never keeps a watched object as a raw dict: each AgentTask,
AgentWorker, AgentQueue, AgentBudget and agentq Lease becomes a frozen view holding only what the
decisions read, typed by the pydantic models (``AgentTaskSpec``,
``AgentTaskStatus``, ``AgentWorkerSpec``). What the operator never reads is
dropped on the way in -- a task's ``payload``, a status' ``result`` -- which
keeps memory small and means no recursive code ever walks them.

No input may stop the operator (docs/operator.md, "Liveness"), so building a view never
raises: what does not fit becomes a ``Problem`` on the view, which the
decisions turn into a visible state. ``decode`` reads JSON nested deeper than
Python's recursion limit (the API server accepts ~10,000 levels) without a
``RecursionError``: containers below ``MAX_JSON_DEPTH`` are replaced by a
marker that the views report as a problem.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from agentq import protocol
from agentq.models import (
    AgentBudgetSpec,
    AgentBudgetStatus,
    AgentQueueSpec,
    AgentQueueStatus,
    AgentTaskSpec,
    AgentTaskStatus,
    AgentWorkerSpec,
    AgentWorkerStatus,
    TaskPhase,
)

__all__ = [
    "TOO_DEEP",
    "BudgetView",
    "LeaseView",
    "Problem",
    "QueueView",
    "TaskView",
    "WorkerView",
    "budget_view",
    "decode",
    "lease_view",
    "namespace_labels",
    "queue_view",
    "task_view",
    "worker_view",
]

#: What ``decode`` puts in place of a container nested deeper than it reads.
TOO_DEEP = "$agentq.dev/nested-too-deeply"
#: The largest AgentTask the operator grants. etcd refuses a request over 1.5 MiB
#: (its default ``--max-request-bytes``); a grant and the final report add status
#: (the report is at most 64 KiB), so a bigger object could be granted but never
#: finished. Refused up front instead, with a condition saying so.
MAX_TASK_BYTES = 1_400_000

Key = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True, slots=True)
class Problem:
    """Why an object cannot be processed: a CamelCase reason and a message for people."""

    reason: str
    message: str


# -- decoding ------------------------------------------------------------------------


_NUMBER = re.compile(r"(-?(?:0|[1-9]\d*))(\.\d+)?([eE][-+]?\d+)?")
_WS = " \t\n\r"


def decode(text: str | bytes, *, max_depth: int = protocol.MAX_JSON_DEPTH) -> Any:
    """JSON to Python; never raises ``RecursionError``.

    Normal documents take ``json.loads`` (fast, C). One nested too deeply for it is
    read again by an iterative parser that keeps the first ``max_depth`` levels and
    puts ``TOO_DEEP`` in place of every container below them. Invalid JSON raises
    ``ValueError`` as ``json.loads`` does.
    """
    try:
        return json.loads(text)
    except RecursionError:
        return _decode_iteratively(text.decode() if isinstance(text, bytes) else text, max_depth)


def _decode_iteratively(s: str, max_depth: int) -> Any:
    stack: list[Any] = []  # open containers being built
    keys: list[str | None] = []  # for each open dict: the key awaiting its value
    skipping = 0  # depth inside a container that is being skipped (too deep)
    i, n = 0, len(s)
    root: Any = None
    have_root = False

    def add(value: Any) -> None:
        nonlocal root, have_root
        if not stack:
            root, have_root = value, True
            return
        top = stack[-1]
        if isinstance(top, list):
            top.append(value)
        else:
            key = keys[-1]
            if key is None:
                raise ValueError(f"JSON object key expected at {i}")
            top[key] = value
            keys[-1] = None

    while i < n:
        c = s[i]
        if c in _WS or c in ",:":
            i += 1
            continue
        if c in "{[":
            if skipping or len(stack) >= max_depth:
                if not skipping:
                    add(TOO_DEEP)
                skipping += 1
            else:
                container: Any = {} if c == "{" else []
                stack.append(container)
                keys.append(None)
            i += 1
            continue
        if c in "}]":
            if skipping:
                skipping -= 1
            else:
                done = stack.pop()
                keys.pop()
                add(done)
            i += 1
            continue
        if c == '"':
            text, i = scanstring(s, i + 1)
            if skipping:
                continue
            top = stack[-1] if stack else None
            if isinstance(top, dict) and keys[-1] is None:
                # A string in key position: the next token is its value.
                j = i
                while j < n and s[j] in _WS:
                    j += 1
                if j < n and s[j] == ":":
                    keys[-1] = text
                    i = j + 1
                    continue
            add(text)
            continue
        if s.startswith("true", i):
            value: Any = True
            i += 4
        elif s.startswith("false", i):
            value, i = False, i + 5
        elif s.startswith("null", i):
            value, i = None, i + 4
        else:
            m = _NUMBER.match(s, i)
            if not m or m.end() == i:
                raise ValueError(f"unexpected character {c!r} at {i}")
            integer, frac, exp = m.groups()
            value = float(integer + (frac or "") + (exp or "")) if frac or exp else int(integer)
            i = m.end()
        if not skipping:
            add(value)
    if stack or not have_root:
        raise ValueError("truncated JSON document")
    return root


def _contains_marker(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if item == TOO_DEEP:
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


_M = TypeVar("_M", bound=BaseModel)


def _lenient(model: type[_M], data: Mapping[str, Any]) -> tuple[_M, str | None]:
    """``model`` from ``data``; fields that do not validate are dropped (and named)."""
    try:
        return model.model_validate(data), None
    except ValidationError as err:
        bad = {str(e["loc"][0]) for e in err.errors() if e["loc"]}
        kept = {k: v for k, v in data.items() if k not in bad}
        try:
            return model.model_validate(kept), ", ".join(sorted(bad)) or "(object)"
        except ValidationError:
            return model.model_validate({}), "(everything)"


def _meta(body: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = body.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def key_of(body: Mapping[str, Any]) -> Key:
    meta = _meta(body)
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


# -- AgentTask -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TaskView:
    """What the operator knows of one AgentTask."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    created: str  # creationTimestamp: queue order (oldest first)
    spec: AgentTaskSpec
    status: AgentTaskStatus
    requeue: str | None  # the agentq.dev/requeue annotation
    problem: Problem | None = None
    status_problem: str | None = None  # status fields that did not validate (ignored)

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)

    @property
    def phase(self) -> TaskPhase | None:
        return self.status.phase

    @property
    def active(self) -> bool:
        return self.status.phase is not None and self.status.phase.is_active

    @property
    def pending(self) -> bool:
        """Waiting for a worker (a task the API server has not defaulted has no phase yet)."""
        return self.status.phase in (None, TaskPhase.PENDING)


def task_view(body: Mapping[str, Any], *, size: int = 0) -> TaskView:
    """The view of an AgentTask body (a decoded dict); ``size`` its JSON length in bytes."""
    meta = _meta(body)
    raw_spec = body.get("spec")
    spec_data = dict(raw_spec) if isinstance(raw_spec, Mapping) else {}
    payload = spec_data.pop("payload", None)
    problem: Problem | None = None
    too_deep = payload is not None and (
        protocol.json_depth(payload) > protocol.MAX_JSON_DEPTH or _contains_marker(payload)
    )
    payload_bytes = 0
    if payload is not None and not too_deep:
        payload_bytes = len(json.dumps(payload, separators=(",", ":")).encode())
        # A listed object comes without its own length: its payload's is most of it.
        size = size or payload_bytes
    if size > MAX_TASK_BYTES:
        problem = Problem(
            "ObjectTooLarge",
            f"the AgentTask is {size} bytes; the operator grants tasks of at most "
            f"{MAX_TASK_BYTES} bytes (etcd refuses objects over 1.5 MiB and the claim's "
            "status must fit too): keep large inputs outside the task and pass a reference",
        )
    elif too_deep:
        problem = Problem(
            "PayloadTooDeep",
            f"spec.payload is nested deeper than {protocol.MAX_JSON_DEPTH} levels",
        )
    elif payload_bytes > protocol.MAX_PAYLOAD_BYTES:
        problem = Problem(
            "PayloadTooLarge",
            f"spec.payload is {payload_bytes} bytes as JSON, over "
            f"{protocol.MAX_PAYLOAD_BYTES}: keep large inputs in your own store and put a "
            "reference in the payload",
        )
    try:
        spec = AgentTaskSpec.model_validate(spec_data)
    except ValidationError as err:
        spec = AgentTaskSpec()
        problem = problem or Problem(
            "InvalidSpec", f"spec does not fit the agentq.dev schema: {_describe(err)}"
        )
    raw_status = body.get("status")
    status_data = dict(raw_status) if isinstance(raw_status, Mapping) else {}
    # The result is written by the operator and never read back: not kept.
    status_data.pop("result", None)
    status, status_problem = _lenient(AgentTaskStatus, status_data)
    annotations = meta.get("annotations") or {}
    return TaskView(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        created=str(meta.get("creationTimestamp") or ""),
        spec=spec,
        status=status,
        requeue=annotations.get(protocol.ANNOTATION_REQUEUE) or None,
        problem=problem,
        status_problem=status_problem,
    )


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors(include_url=False)[:5]:
        where = ".".join(str(p) for p in e["loc"]) or "(object)"
        parts.append(f"{where}: {e['msg']}")
    return "; ".join(parts)[:1000]


# -- AgentWorker ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerView:
    """What the operator knows of one AgentWorker."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    spec: AgentWorkerSpec | None  # None: it does not fit the schema (``problem`` says why)
    status: AgentWorkerStatus
    problem: Problem | None = None
    # The UID of the Pod that owns it (a pool's per-pod worker, docs/autoscaling.md):
    # the claim API gives such a worker's claims to that pod's token alone.
    owner_pod_uid: str | None = None

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)


def _strict_spec(model: type[_M], body: Mapping[str, Any]) -> tuple[_M | None, Problem | None]:
    """``body``'s spec as ``model``, or None and the problem (``InvalidSpec``) why not."""
    raw = body.get("spec")
    try:
        return model.model_validate(raw if isinstance(raw, Mapping) else {}), None
    except ValidationError as err:
        return None, Problem(
            "InvalidSpec", f"spec does not fit the agentq.dev schema: {_describe(err)}"
        )


def worker_view(body: Mapping[str, Any]) -> WorkerView:
    meta = _meta(body)
    spec, problem = _strict_spec(AgentWorkerSpec, body)
    raw_status = body.get("status")
    status, _ = _lenient(AgentWorkerStatus, raw_status if isinstance(raw_status, Mapping) else {})
    return WorkerView(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        spec=spec,
        status=status,
        problem=problem,
        owner_pod_uid=_owner_pod_uid(meta),
    )


def _owner_pod_uid(meta: Mapping[str, Any]) -> str | None:
    """The UID of the (core v1) Pod among the object's owners, if exactly one is."""
    uids = {
        str(ref.get("uid"))
        for ref in meta.get("ownerReferences") or []
        if isinstance(ref, Mapping)
        and ref.get("kind") == "Pod"
        and ref.get("apiVersion") == "v1"
        and ref.get("uid")
    }
    return uids.pop() if len(uids) == 1 else None


# -- AgentQueue, AgentBudget and Namespace (cluster-scoped) ---------------------------


@dataclass(frozen=True, slots=True)
class QueueView:
    """What the operator knows of one AgentQueue."""

    name: str
    uid: str
    resource_version: str
    spec: AgentQueueSpec | None  # None: it does not fit the schema (``problem`` says why)
    problem: Problem | None = None
    # What its status shows (fields that do not fit the schema dropped), and the
    # generation of its spec: the operator writes the status (``queue_status``).
    status: AgentQueueStatus = field(default_factory=AgentQueueStatus)
    generation: int | None = None


def _cluster_fields(body: Mapping[str, Any], spec_model: Any, status_model: Any) -> dict[str, Any]:
    """The fields every cluster-scoped view (AgentQueue, AgentBudget) holds: the spec
    read strictly, the status leniently, the spec's generation."""
    meta = _meta(body)
    spec, problem = _strict_spec(spec_model, body)
    raw_status = body.get("status")
    status, _ = _lenient(status_model, raw_status if isinstance(raw_status, Mapping) else {})
    generation = meta.get("generation")
    return {
        "name": str(meta.get("name") or ""),
        "uid": str(meta.get("uid") or ""),
        "resource_version": str(meta.get("resourceVersion") or ""),
        "spec": spec,
        "problem": problem,
        "status": status,
        "generation": generation if isinstance(generation, int) and generation >= 0 else None,
    }


def queue_view(body: Mapping[str, Any]) -> QueueView:
    return QueueView(**_cluster_fields(body, AgentQueueSpec, AgentQueueStatus))


@dataclass(frozen=True, slots=True)
class BudgetView:
    """What the operator knows of one AgentBudget (cluster-scoped)."""

    name: str
    uid: str
    resource_version: str
    spec: AgentBudgetSpec | None  # None: it does not fit the schema (``problem`` says why)
    problem: Problem | None = None
    # What its status shows (fields that do not fit the schema dropped): a new leader
    # resumes from its window and throttle (docs/budgets.md).
    status: AgentBudgetStatus = field(default_factory=AgentBudgetStatus)
    generation: int | None = None


def budget_view(body: Mapping[str, Any]) -> BudgetView:
    return BudgetView(**_cluster_fields(body, AgentBudgetSpec, AgentBudgetStatus))


def namespace_labels(body: Mapping[str, Any]) -> dict[str, str]:
    """A Namespace's labels (what an AgentQueue's namespaceSelector reads)."""
    labels = _meta(body).get("labels")
    if not isinstance(labels, Mapping):
        return {}
    return {str(k): str(v) for k, v in labels.items() if isinstance(v, str)}


# -- Lease ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeaseView:
    """An agentq Lease (task claim or worker readiness), as far as the operator reads it."""

    namespace: str
    name: str
    resource_version: str
    kind: str  # protocol.LEASE_KIND_TASK / LEASE_KIND_WORKER, else ""
    subject: str  # the task (or worker) it is about: its label, else its name unprefixed
    holder: str | None
    acquire_time: str | None
    renew_time: str | None
    duration: int | None  # the Lease's own field: judged for worker Leases only
    token: int | None  # the fencing-token annotation, strictly parsed (None: absent or bad)
    token_text: str | None  # the annotation as written
    attempt: str | None
    task_uid: str | None  # agentq.dev/task-uid, else the owning AgentTask's UID
    progress: str | None
    report: str | None
    # Its agentq.dev/worker label (task Leases): the expiries of one worker's claims are
    # confirmed with one LIST by this label.
    worker_label: str | None = None
    # Why the operator revoked this claim (agentq.dev/revoked): Cancelled or
    # DeadlineExceeded; any other text is taken as Cancelled. None: not revoked.
    revoked: str | None = None
    # A claim of another namespace's task (``agentq-xtask-<namespace>.<task>``): that
    # namespace, from the name. None: the task is of the Lease's own namespace.
    task_namespace: str | None = None
    # What its attempt reported spending (agentq.dev/usage) and its last throttle report
    # (agentq.dev/throttled), as written: read by the budgets (docs/budgets.md).
    usage: str | None = None
    throttled: str | None = None
    # A worker Lease annotated agentq.dev/draining=true: its pod is going away; its
    # claims stay, no new task is given to it.
    draining: bool = False

    @property
    def key(self) -> Key:
        return (self.namespace, self.name)

    @property
    def task(self) -> Key:
        """The task a claim Lease is of (its subject, in its task namespace)."""
        return (self.task_namespace or self.namespace, self.subject)

    @property
    def fingerprint(self) -> tuple[object, ...]:
        """What changes when the holder writes (renewal, progress, report) -- or anyone does."""
        return (
            self.holder,
            self.renew_time,
            self.token_text,
            self.progress,
            self.report,
            self.draining,
        )


def lease_view(body: Mapping[str, Any]) -> LeaseView:
    meta = _meta(body)
    spec = body.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    token_text = annotations.get(protocol.ANNOTATION_TOKEN)
    task_uid = annotations.get(protocol.ANNOTATION_TASK_UID)
    if not task_uid:
        for ref in meta.get("ownerReferences") or []:
            if isinstance(ref, Mapping) and ref.get("kind") == "AgentTask":
                task_uid = ref.get("uid")
    duration = spec.get("leaseDurationSeconds")
    name = str(meta.get("name") or "")
    kind = str(labels.get(protocol.LABEL_LEASE_KIND) or "")
    # Whose Lease it is follows from its name, which the operator (or the worker's
    # sidecar) chose and nobody can change: the agentq.dev/task and agentq.dev/worker
    # labels are for selectors, and anyone with Lease rights can point them elsewhere.
    worker = kind == protocol.LEASE_KIND_WORKER
    task_namespace = None
    if not worker and name.startswith(protocol.XTASK_LEASE_PREFIX):
        split = protocol.split_cross_task(name[len(protocol.XTASK_LEASE_PREFIX) :])
        task_namespace, subject = split if split is not None else (None, name)
    else:
        subject = name.removeprefix(
            protocol.WORKER_LEASE_PREFIX if worker else protocol.TASK_LEASE_PREFIX
        )
    return LeaseView(
        namespace=str(meta.get("namespace") or ""),
        name=name,
        resource_version=str(meta.get("resourceVersion") or ""),
        kind=kind,
        subject=str(subject),
        holder=spec.get("holderIdentity") or None,
        acquire_time=_str(spec.get("acquireTime")),
        renew_time=_str(spec.get("renewTime")),
        duration=duration if protocol.is_json_int(duration) and duration > 0 else None,
        token=protocol.parse_token(token_text),
        token_text=token_text,
        attempt=annotations.get(protocol.ANNOTATION_ATTEMPT),
        task_uid=str(task_uid) if task_uid else None,
        progress=annotations.get(protocol.ANNOTATION_PROGRESS),
        report=annotations.get(protocol.ANNOTATION_REPORT),
        worker_label=_label(labels.get(protocol.LABEL_WORKER)),
        revoked=_revoked(annotations.get(protocol.ANNOTATION_REVOKED)),
        task_namespace=task_namespace,
        usage=_str(annotations.get(protocol.ANNOTATION_USAGE)),
        throttled=_str(annotations.get(protocol.ANNOTATION_THROTTLED)),
        draining=annotations.get(protocol.ANNOTATION_DRAINING) == "true",
    )


def _revoked(text: object) -> str | None:
    if text is None:
        return None
    return text if text in protocol.REVOKE_REASONS else protocol.REVOKE_CANCELLED


def _label(value: Any) -> str | None:
    return sys.intern(value) if isinstance(value, str) and value else None


def _str(value: Any) -> str | None:
    return None if value is None else str(value)
