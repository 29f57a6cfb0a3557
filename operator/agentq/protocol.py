"""The wire protocol between the operator and agents: names, labels, annotations.

An agent never writes an AgentTask. Everything it says travels on the claim's
Lease (DESIGN "Fencing"): renewals in ``spec.renewTime``, a progress marker and
the final report in annotations under ``agentq.dev/``. The operator writes the
fencing token onto the Lease when it grants it. This module is pure: it builds
and parses those values and does no I/O.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from agentq import GROUP

LABEL_LEASE_KIND = f"{GROUP}/lease"  # "task" or "worker"
LABEL_TASK = f"{GROUP}/task"
LABEL_WORKER = f"{GROUP}/worker"
ANNOTATION_TOKEN = f"{GROUP}/fencing-token"
ANNOTATION_ATTEMPT = f"{GROUP}/attempt"
ANNOTATION_PROGRESS = f"{GROUP}/progress"
ANNOTATION_REPORT = f"{GROUP}/report"
ANNOTATION_REQUEUE = f"{GROUP}/requeue"  # set on an AgentTask by `agentq requeue`
ANNOTATION_TASK_UID = f"{GROUP}/task-uid"  # on a task Lease: the UID of the task it claims

TASK_LEASE_PREFIX = "agentq-task-"
WORKER_LEASE_PREFIX = "agentq-worker-"

# An annotation value is bounded by the 256 KiB total of all annotations; keep
# reports well below so a Lease update never fails for size. Larger results go to
# the agent's own sink and the report carries a reference (``resultRef``).
MAX_REPORT_BYTES = 64 * 1024
MAX_PROGRESS_BYTES = 1024
# Field limits of a report (the contract's numbers; the task status schema accepts
# these): the sidecar refuses longer input with a 4xx.
MAX_REASON_CHARS = 1024
MAX_MESSAGE_CHARS = 32768
MAX_RESULT_REF_CHARS = 4096

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
        try:
            body = json.loads(text)
            outcome = body["outcome"]
            if outcome not in ("Succeeded", "Failed"):
                raise ProtocolError(f"unknown outcome {outcome!r}")
            error = body.get("error")
            return cls(
                token=int(body["token"]),
                worker=str(body["worker"]),
                outcome=outcome,
                result=body.get("result"),
                result_ref=body.get("resultRef"),
                error=(
                    ErrorInfo(
                        reason=str(error.get("reason", "Unknown")),
                        message=str(error.get("message", "")),
                        retryable=bool(error.get("retryable", True)),
                    )
                    if isinstance(error, dict)
                    else None
                ),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise ProtocolError(f"unreadable report annotation: {err}") from err


def lease_token(annotations: dict[str, str] | None) -> int | None:
    """The fencing token the operator wrote on a task Lease (None if absent or bad)."""
    raw = (annotations or {}).get(ANNOTATION_TOKEN)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def check_progress(progress: str) -> str:
    if len(progress.encode()) > MAX_PROGRESS_BYTES:
        raise ProtocolError(f"progress marker over {MAX_PROGRESS_BYTES} bytes")
    return progress
