"""The wire protocol between the operator and agents: names, labels, annotations.

An agent never writes an AgentTask. Everything it says travels on the claim's
Lease (docs/fencing.md): renewals in ``spec.renewTime``, a progress marker and
the final report in annotations under ``agentq.dev/``. The operator writes the
fencing token onto the Lease when it grants it. This module is pure: it builds
and parses those values and does no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal, TypeGuard

from agentq import GROUP

LABEL_LEASE_KIND = f"{GROUP}/lease"  # "task" or "worker"
LABEL_TASK = f"{GROUP}/task"
LABEL_WORKER = f"{GROUP}/worker"
# On a cross-namespace claim's Lease (in the worker's namespace): the task's namespace.
LABEL_TASK_NAMESPACE = f"{GROUP}/task-namespace"
ANNOTATION_TOKEN = f"{GROUP}/fencing-token"
ANNOTATION_ATTEMPT = f"{GROUP}/attempt"
ANNOTATION_PROGRESS = f"{GROUP}/progress"
ANNOTATION_REPORT = f"{GROUP}/report"
ANNOTATION_REQUEUE = f"{GROUP}/requeue"  # set on an AgentTask by `agentq requeue`
ANNOTATION_TASK_UID = f"{GROUP}/task-uid"  # the UID of the AgentTask a task Lease belongs to
# Set by the operator on a task Lease whose claim it revokes: why (REVOKE_REASONS). The
# sidecar stops renewing it and answers its agent 409 with that reason as the error.
ANNOTATION_REVOKED = f"{GROUP}/revoked"
# Set on its worker Lease by a sidecar whose pod is going away (its agent asked it to
# drain: a scale-down): the worker keeps and renews its claims but gets no new task.
ANNOTATION_DRAINING = f"{GROUP}/draining"
REVOKE_CANCELLED = "Cancelled"  # spec.cancel
REVOKE_DEADLINE = "DeadlineExceeded"  # spec.activeDeadlineSeconds passed
REVOKE_REASONS = (REVOKE_CANCELLED, REVOKE_DEADLINE)
# The admission policy that refuses a grant carrying an older leader epoch than the
# operator's election Lease (manifests/leader-epoch-policy.yaml); its name is in the refusal.
LEADER_EPOCH_POLICY = "agentq-leader-epoch"
LEASE_KIND_TASK = "task"
LEASE_KIND_WORKER = "worker"

TASK_LEASE_PREFIX = "agentq-task-"
# A claim of a task of another namespace: its Lease lives in the worker's namespace as
# ``agentq-xtask-<task namespace>.<task>`` (docs/tenancy.md, "Cross-namespace claims").
XTASK_LEASE_PREFIX = "agentq-xtask-"
WORKER_LEASE_PREFIX = "agentq-worker-"

# An annotation value is bounded by the 256 KiB total of all annotations; keep
# reports well below so a Lease update never fails for size. Larger results go to
# the agent's own sink and the report carries a reference (``resultRef``).
MAX_REPORT_BYTES = 64 * 1024
MAX_PROGRESS_BYTES = 1024
# What AgentTask.status accepts (the CRD's maxLength, in characters). A report's free
# text (reason, message) and a progress marker longer than this are truncated when
# the operator copies them into status; a longer resultRef is refused (a reference
# cut short points nowhere).
MAX_REASON_CHARS = 1024
MAX_MESSAGE_CHARS = 32768
MAX_RESULT_REF_CHARS = 4096
MAX_PROGRESS_CHARS = 1024
# status.requeueHandled keeps at most this much of an agentq.dev/requeue request id;
# a longer request is honoured once all the same: it is compared as stored
# (``requeue_id``), else it would redrive the task again every time it ends.
MAX_REQUEUE_CHARS = 256


def requeue_id(request: str) -> str:
    """The form of a requeue request id kept in (and compared with) status.requeueHandled."""
    return request[:MAX_REQUEUE_CHARS]


# JSON nested deeper than this (a task's payload, a report's result) is refused: deep
# enough for any real document, shallow enough that no recursive code path (json,
# copy.deepcopy, pydantic) in the operator, the sidecar or an agent can overflow.
MAX_JSON_DEPTH = 64
# A task's payload larger than this as JSON is refused (docs/api.md): the whole object
# must fit etcd's 1.5 MiB with room for its status, and inputs this large belong in the
# agent's own store, referenced from the payload.
MAX_PAYLOAD_BYTES = 256 * 1024

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")

Outcome = Literal["Succeeded", "Failed"]


class ProtocolError(ValueError):
    """A value does not follow the protocol; the message says which and why."""


def _shorten(name: str, limit: int) -> str:
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[: limit - 11].rstrip('-.')}-{digest}"


def label_value(name: str) -> str:
    """A valid label value naming ``name`` (object names may exceed 63 characters)."""
    value = _shorten(name, 63)
    if not _LABEL_VALUE.match(value):
        raise ProtocolError(f"cannot make a label value of {name!r}")
    return value


def task_lease_name(task: str) -> str:
    return _shorten(TASK_LEASE_PREFIX + task, 253)


def cross_task_lease_name(namespace: str, task: str) -> str:
    """The name of the Lease, in the worker's namespace, of a claim of task ``task`` of
    namespace ``namespace``. A namespace is a DNS label (no dot), so the name splits
    back at its first dot (``split_cross_task``) unless it had to be shortened."""
    return _shorten(f"{XTASK_LEASE_PREFIX}{namespace}.{task}", 253)


def split_cross_task(rest: str) -> tuple[str, str] | None:
    """``"<namespace>.<task>"`` (a cross-namespace Lease's name without its prefix) as
    ``(namespace, task)``; None if it has no dot or an empty side. A shortened name
    (over 253 characters) splits into a task name that is not the task's: the Lease's
    labels and annotations, not its name, say which task it is."""
    namespace, dot, task = rest.partition(".")
    if not dot or not namespace or not task:
        return None
    return namespace, task


# The id an agent knows a cross-namespace claim by: ``<task namespace>~<task>``. No
# object name holds a "~", so it never meets the name of a task of the worker's own
# namespace (whose id is its name).
CLAIM_ID_SEPARATOR = "~"


def cross_claim_id(namespace: str, task: str) -> str:
    return f"{namespace}{CLAIM_ID_SEPARATOR}{task}"


def split_claim_id(claim_id: str) -> tuple[str, str] | None:
    """``(task namespace, task)`` of a cross-namespace claim's id; None for the id of a
    task of the worker's own namespace (its name)."""
    namespace, sep, task = claim_id.partition(CLAIM_ID_SEPARATOR)
    if not sep or not namespace or not task:
        return None
    return namespace, task


def worker_lease_name(worker: str) -> str:
    return _shorten(WORKER_LEASE_PREFIX + worker, 253)


@dataclass(frozen=True)
class ErrorInfo:
    reason: str
    message: str = ""
    retryable: bool = True


@dataclass(frozen=True)
class Report:
    """An attempt's final word, written by its holder onto the claim's Lease."""

    token: int
    worker: str
    outcome: Outcome
    result: Any = None
    result_ref: str | None = None
    error: ErrorInfo | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> str:
        body: dict[str, Any] = {"token": self.token, "worker": self.worker, "outcome": self.outcome}
        if self.result is not None:
            body["result"] = self.result
        if self.result_ref is not None:
            body["resultRef"] = self.result_ref
        if self.error is not None:
            body["error"] = {
                "reason": self.error.reason,
                "message": self.error.message,
                "retryable": self.error.retryable,
            }
        text = json.dumps(body, separators=(",", ":"), sort_keys=True)
        if len(text.encode()) > MAX_REPORT_BYTES:
            raise ProtocolError(
                f"report is {len(text.encode())} bytes, over the {MAX_REPORT_BYTES}-byte limit "
                "of a Lease annotation; store the result in your own sink and report a resultRef"
            )
        return text

    @classmethod
    def decode(cls, text: str) -> Report:
        """Decode a report annotation STRICTLY; ``ProtocolError`` says what is wrong.

        The token must be a JSON integer >= 1 (not a bool, a string or a float), the
        worker a non-empty string, the outcome one of the two known ones, ``error`` an
        object with a string ``reason``, an optional string ``message`` and an optional
        boolean ``retryable``; ``resultRef`` a string of at most
        ``MAX_RESULT_REF_CHARS``; the result nested at most ``MAX_JSON_DEPTH`` deep.
        Free text (reason, message) may be longer than status accepts: the operator
        truncates it when it copies it (``bounded_text``).
        """
        if len(text) > MAX_REPORT_BYTES or len(text.encode()) > MAX_REPORT_BYTES:
            raise ProtocolError(f"report annotation is over {MAX_REPORT_BYTES} bytes")
        body = decode_json(text, what="report annotation")
        if not isinstance(body, dict):
            raise ProtocolError("report annotation is not a JSON object")
        token = body.get("token")
        if not is_json_int(token) or token < 1:
            raise ProtocolError(f"report token must be a JSON integer >= 1, not {token!r}")
        worker = body.get("worker")
        if not isinstance(worker, str) or not worker:
            raise ProtocolError(f"report worker must be a non-empty string, not {worker!r}")
        outcome = body.get("outcome")
        if outcome not in ("Succeeded", "Failed"):
            raise ProtocolError(f"unknown outcome {outcome!r}")
        result_ref = body.get("resultRef")
        if result_ref is not None and not isinstance(result_ref, str):
            raise ProtocolError("report resultRef must be a string")
        if result_ref is not None and len(result_ref) > MAX_RESULT_REF_CHARS:
            raise ProtocolError(
                f"report resultRef is {len(result_ref)} characters, over {MAX_RESULT_REF_CHARS}"
            )
        result = body.get("result")
        if json_depth(result) > MAX_JSON_DEPTH:
            raise ProtocolError(f"report result is nested deeper than {MAX_JSON_DEPTH} levels")
        return cls(
            token=token,
            worker=worker,
            outcome=outcome,
            result=result,
            result_ref=result_ref,
            error=_decode_error(body.get("error")),
        )


def _decode_error(error: Any) -> ErrorInfo | None:
    if error is None:
        return None
    if not isinstance(error, dict):
        raise ProtocolError("report error must be an object")
    reason = error.get("reason", "Unknown")
    message = error.get("message", "")
    retryable = error.get("retryable", True)
    if not isinstance(reason, str) or not isinstance(message, str):
        raise ProtocolError("report error reason and message must be strings")
    if not isinstance(retryable, bool):
        raise ProtocolError(f"report error retryable must be a boolean, not {retryable!r}")
    return ErrorInfo(reason=reason or "Unknown", message=message, retryable=retryable)


def is_json_int(value: Any) -> TypeGuard[int]:
    """An integer as JSON means it: ``1`` yes; ``true``, ``"1"`` and ``1.0`` no."""
    return isinstance(value, int) and not isinstance(value, bool)


def decode_json(text: str | bytes, *, what: str) -> Any:
    """``json.loads`` that reports nesting too deep to decode as a ``ProtocolError``."""
    try:
        return json.loads(text)
    except RecursionError as err:
        raise ProtocolError(f"{what} is nested too deeply to decode") from err
    except ValueError as err:
        raise ProtocolError(f"{what} is not valid JSON: {err}") from err


def json_depth(value: Any, *, limit: int = MAX_JSON_DEPTH) -> int:
    """How deeply ``value`` nests objects and arrays (a scalar is 0), counted without
    recursion; stops counting once past ``limit`` (returns ``limit + 1``)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        depth += 1
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return limit + 1
        stack.extend((child, depth) for child in children)
    return deepest


def bounded_text(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, saying so when it was cut."""
    if len(text) <= limit:
        return text
    marker = f"... [truncated from {len(text)} characters]"
    return text[: max(0, limit - len(marker))] + marker


def parse_token(raw: str | None) -> int | None:
    """A fencing-token annotation: a plain decimal integer >= 1, else None.

    Strict: ``"1.9"``, ``"true"``, ``" 1"``, ``"+1"``, ``"01"`` and ``"0"`` are not
    tokens the operator wrote.
    """
    if raw is None or not raw.isascii() or not raw.isdigit() or raw.startswith("0"):
        return None
    if len(raw) > 19:  # beyond int64: no operator wrote it
        return None
    return int(raw)


def lease_token(annotations: dict[str, str] | None) -> int | None:
    """The fencing token the operator wrote on a task Lease (None if absent or bad)."""
    return parse_token((annotations or {}).get(ANNOTATION_TOKEN))


def check_progress(progress: str) -> str:
    if len(progress.encode()) > MAX_PROGRESS_BYTES:
        raise ProtocolError(f"progress marker over {MAX_PROGRESS_BYTES} bytes")
    return progress
