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
# The attempt's usage of the budgets its task names, cumulative (``encode_usage``), and
# the last throttle its agent reported (``Throttle``): written by the sidecar with its
# renewals and report, read by the operator (docs/budgets.md).
ANNOTATION_USAGE = f"{GROUP}/usage"
ANNOTATION_THROTTLED = f"{GROUP}/throttled"
ANNOTATION_REQUEUE = f"{GROUP}/requeue"  # set on an AgentTask by `agentq requeue`
ANNOTATION_TASK_UID = f"{GROUP}/task-uid"  # the UID of the AgentTask a task Lease belongs to
# Set by the operator on a task Lease whose claim it revokes: why (REVOKE_REASONS). The
# sidecar stops renewing it and answers its agent 409 with that reason as the error.
ANNOTATION_REVOKED = f"{GROUP}/revoked"
# Set on its worker Lease by a sidecar whose pod is going away (its agent asked it to
# drain: a scale-down): the worker keeps and renews its claims but gets no new task.
ANNOTATION_DRAINING = f"{GROUP}/draining"
# Set on its worker Lease by a sidecar that releases it (holder cleared, on SIGTERM): its
# identity. A sidecar restarted in the same pod (same identity) takes the Lease and its
# task Leases back, as after a crash; another pod's sidecar takes it over.
ANNOTATION_RELEASED_BY = f"{GROUP}/released-by"
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

# Usage reports and throttles (docs/budgets.md, "Bad input"): the largest requests and
# tokens one attempt may report on a budget (as an estimate may hold), the longest
# retry-after a throttle may ask, the most budgets a task names, and a budget's name.
MAX_USAGE_REQUESTS = 1_000_000_000
MAX_USAGE_TOKENS = 1_000_000_000_000
MAX_RETRY_AFTER_SECONDS = 3600
MAX_USAGE_BUDGETS = 8
MAX_THROTTLE_ID_CHARS = 64
_BUDGET_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
MAX_BUDGET_NAME_CHARS = 63

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


def cross_task_lease_fits(namespace: str, task: str) -> bool:
    """Does the cross-namespace Lease name of task ``task`` of ``namespace`` fit an
    object name (253 characters) whole? Always, for names the CRDs admit (a namespace
    and a task name of at most 63 characters: 140); a task named longer (its CRD's
    rule bypassed) would get a shortened name that names no task, so the operator
    never grants one across namespaces (verdict ``TaskNameTooLong``)."""
    return len(XTASK_LEASE_PREFIX) + len(namespace) + 1 + len(task) <= 253


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
    # The attempt's final usage of its task's budgets (cumulative); None: none reported.
    usage: dict[str, Usage] | None = None

    def encode(self) -> str:
        body: dict[str, Any] = {"token": self.token, "worker": self.worker, "outcome": self.outcome}
        if self.usage:
            body["usage"] = usage_json(self.usage)
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
        usage = body.get("usage")
        return cls(
            token=token,
            worker=worker,
            outcome=outcome,
            result=result,
            result_ref=result_ref,
            error=_decode_error(body.get("error")),
            usage=None if usage is None else parse_usage(usage, what="report usage"),
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


def claim_id(namespace: str, task: str, worker_namespace: str) -> str:
    """How a worker of ``worker_namespace`` knows task ``task`` of ``namespace``: its name
    when the task is of the worker's own namespace, else ``<namespace>~<task>``."""
    return task if namespace == worker_namespace else cross_claim_id(namespace, task)


def claim_task(worker_namespace: str, claim: str) -> tuple[str, str]:
    """``(task namespace, task)`` of a claim id a worker of ``worker_namespace`` holds."""
    split = split_claim_id(claim)
    return split if split is not None else (worker_namespace, claim)


def assigned_name(claim: str) -> str:
    """A claim id as ``AgentWorker.status.assignedTasks`` lists it: a task of the worker's
    own namespace by its name, another's as ``<namespace>/<task>``."""
    split = split_claim_id(claim)
    return claim if split is None else f"{split[0]}/{split[1]}"


# -- budgets: usage and throttles (docs/budgets.md) ---------------------------------------


@dataclass(frozen=True)
class Usage:
    """What an attempt spent of one budget so far: requests and tokens, cumulative."""

    requests: int = 0
    tokens: int = 0

    def covers(self, other: Usage) -> bool:
        """Not lower than ``other`` in either amount (a later cumulative report)."""
        return self.requests >= other.requests and self.tokens >= other.tokens


def check_budget_name(name: Any, *, what: str) -> str:
    """An AgentBudget's name as a task's ``spec.budgets`` names it, else ProtocolError."""
    if not isinstance(name, str):
        raise ProtocolError(f"{what} must be a budget's name (a string), not {name!r}")
    if not 1 <= len(name) <= MAX_BUDGET_NAME_CHARS or not _BUDGET_NAME.fullmatch(name):
        raise ProtocolError(
            f"{what} {name[:80]!r} is not a budget's name (1 to {MAX_BUDGET_NAME_CHARS} "
            "lowercase letters, digits, '-' and '.', starting and ending alphanumeric)"
        )
    return name


def _amount(value: Any, *, what: str, limit: int) -> int:
    if not is_json_int(value):
        raise ProtocolError(f"{what} must be an integer, not {value!r}"[:300])
    if not 0 <= value <= limit:
        raise ProtocolError(f"{what} must be between 0 and {limit}, not {value}")
    return value


def _only_fields(value: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    """ProtocolError naming the first fields of ``value`` not in ``allowed``."""
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise ProtocolError(
            f"{where} has unknown field(s) {', '.join(map(repr, unknown[:5]))}; "
            f"allowed: {', '.join(allowed)}"
        )


def parse_usage(
    value: Any,
    *,
    what: str = "usage",
    previous: dict[str, Usage] | None = None,
    names: bool = True,
) -> dict[str, Usage]:
    """A usage object as JSON (``{"<budget>": {"requests": n, "tokens": n}}``, decoded)
    read STRICTLY: at most ``MAX_USAGE_BUDGETS`` budgets, each a budget's name; each
    entry an object of ``requests`` (0 to ``MAX_USAGE_REQUESTS``) and ``tokens`` (0 to
    ``MAX_USAGE_TOKENS``), JSON integers, nothing else. An amount left out is the one in
    ``previous`` (the attempt's report so far), else 0. ProtocolError says what is wrong.
    ``names=False`` leaves the budgets' names unchecked (any string): for a caller that
    then checks them against the names a task gives, which is stricter.
    """
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} must be an object of budgets, not {type(value).__name__}")
    if len(value) > MAX_USAGE_BUDGETS:
        raise ProtocolError(
            f"{what} names {len(value)} budgets; a task names at most {MAX_USAGE_BUDGETS}"
        )
    before = previous or {}
    out: dict[str, Usage] = {}
    for name, entry in value.items():
        if names:
            check_budget_name(name, what=f"{what}: budget")
        where = f"{what}[{name!r}]"
        if not isinstance(entry, dict):
            raise ProtocolError(
                f"{where} must be an object with requests and tokens, not {type(entry).__name__}"
            )
        _only_fields(entry, ("requests", "tokens"), where)
        old = before.get(name, Usage())
        requests = entry.get("requests", old.requests)
        tokens = entry.get("tokens", old.tokens)
        out[name] = Usage(
            requests=_amount(requests, what=f"{where}.requests", limit=MAX_USAGE_REQUESTS),
            tokens=_amount(tokens, what=f"{where}.tokens", limit=MAX_USAGE_TOKENS),
        )
    return out


def merge_usage(
    previous: dict[str, Usage], reported: dict[str, Usage], *, named: Any = None
) -> dict[str, Usage]:
    """The attempt's cumulative usage after ``reported`` (parsed by ``parse_usage``) on
    top of ``previous``: budgets not reported keep their amounts. ProtocolError if a
    budget is not among ``named`` (the task's spec.budgets; None: not checked) or an
    amount is lower than the attempt's previous report (reports are cumulative)."""
    total = dict(previous)
    for name, usage in reported.items():
        if named is not None and name not in named:
            listed = ", ".join(sorted(named)) or "none"
            raise ProtocolError(
                f"usage for budget {name!r}, which the task does not name "
                f"(its spec.budgets: {listed})"
            )
        old = previous.get(name)
        if old is not None and not usage.covers(old):
            raise ProtocolError(
                f"usage of budget {name!r} (requests {usage.requests}, tokens {usage.tokens}) "
                f"is lower than this attempt's previous report (requests {old.requests}, "
                f"tokens {old.tokens}); usage is cumulative for the attempt"
            )
        total[name] = usage
    return total


def usage_json(usage: dict[str, Usage]) -> dict[str, dict[str, int]]:
    return {name: {"requests": u.requests, "tokens": u.tokens} for name, u in sorted(usage.items())}


def encode_usage(usage: dict[str, Usage]) -> str:
    """The ``agentq.dev/usage`` annotation: every budget with both amounts, sorted."""
    return json.dumps(usage_json(usage), separators=(",", ":"), sort_keys=True)


def decode_usage(text: str) -> dict[str, Usage]:
    """An ``agentq.dev/usage`` annotation, STRICTLY (``parse_usage``); ProtocolError."""
    if len(text) > MAX_REPORT_BYTES:
        raise ProtocolError(f"usage annotation is over {MAX_REPORT_BYTES} bytes")
    return parse_usage(decode_json(text, what="usage annotation"), what="usage annotation")


@dataclass(frozen=True)
class Throttle:
    """A provider's 429 an agent reported: pause ``budget`` for ``retry_after_seconds``
    (from when the operator reads it). ``id`` is unique per report, so the operator
    applies each once however often it sees the annotation."""

    budget: str
    retry_after_seconds: float
    id: str

    def encode(self) -> str:
        return json.dumps(
            {"budget": self.budget, "retryAfterSeconds": self.retry_after_seconds, "id": self.id},
            separators=(",", ":"),
            sort_keys=True,
        )

    @classmethod
    def decode(cls, text: str) -> Throttle:
        """An ``agentq.dev/throttled`` annotation, STRICTLY; ProtocolError says why."""
        if len(text) > MAX_PROGRESS_BYTES:
            raise ProtocolError(f"throttled annotation is over {MAX_PROGRESS_BYTES} bytes")
        body = decode_json(text, what="throttled annotation")
        if not isinstance(body, dict):
            raise ProtocolError("throttled annotation is not a JSON object")
        unknown = sorted(set(body) - {"budget", "retryAfterSeconds", "id"})
        if unknown:
            raise ProtocolError(f"throttled annotation has unknown field(s) {unknown[:5]}")
        ident = body.get("id")
        if not isinstance(ident, str) or not 1 <= len(ident) <= MAX_THROTTLE_ID_CHARS:
            raise ProtocolError(
                f"throttled annotation id must be a string of 1 to {MAX_THROTTLE_ID_CHARS} "
                f"characters, not {ident!r}"[:300]
            )
        budget, seconds = parse_throttle(
            {"budget": body.get("budget"), "retryAfterSeconds": body.get("retryAfterSeconds")},
            what="throttled annotation",
        )
        return cls(budget=budget, retry_after_seconds=seconds, id=ident)


def parse_throttle(value: Any, *, what: str = "throttled", names: bool = True) -> tuple[str, float]:
    """A throttle as an agent sends it (``{"budget", "retryAfterSeconds"}``, decoded)
    STRICTLY: a budget's name and a number of seconds in ``(0, MAX_RETRY_AFTER_SECONDS]``
    (an integer, or a finite fraction). Returns ``(budget, seconds)``; ProtocolError.
    ``names=False``: the budget need only be a string (see ``parse_usage``)."""
    if not isinstance(value, dict):
        raise ProtocolError(
            f"{what} must be an object with budget and retryAfterSeconds, "
            f"not {type(value).__name__}"
        )
    _only_fields(value, ("budget", "retryAfterSeconds"), what)
    if "budget" not in value or "retryAfterSeconds" not in value:
        raise ProtocolError(f"{what} needs both budget and retryAfterSeconds")
    budget = value["budget"]
    if names or not isinstance(budget, str):
        check_budget_name(budget, what=f"{what}.budget")
    seconds = value["retryAfterSeconds"]
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise ProtocolError(
            f"{what}.retryAfterSeconds must be a number of seconds, not {seconds!r}"[:300]
        )
    if not (0 < seconds <= MAX_RETRY_AFTER_SECONDS):  # NaN fails this too
        raise ProtocolError(
            f"{what}.retryAfterSeconds must be above 0 and at most "
            f"{MAX_RETRY_AFTER_SECONDS}, not {seconds}"
        )
    return budget, seconds


def lease_usage(annotations: dict[str, str] | None) -> dict[str, Usage] | None:
    """The usage a task Lease carries (None: absent, or not what a sidecar writes)."""
    text = (annotations or {}).get(ANNOTATION_USAGE)
    if text is None:
        return None
    try:
        return decode_usage(text)
    except ProtocolError:
        return None


def lease_throttle(annotations: dict[str, str] | None) -> Throttle | None:
    """The throttle a task Lease carries (None: absent, or not what a sidecar writes)."""
    text = (annotations or {}).get(ANNOTATION_THROTTLED)
    if text is None:
        return None
    try:
        return Throttle.decode(text)
    except ProtocolError:
        return None
