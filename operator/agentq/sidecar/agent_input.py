"""Strict reading of what the agent sends (pure): JSON bodies, path and query values.

Everything an agent sends is checked here before it reaches the attempts or the
API server: a malformed body, a wrong type, an unknown field or a value over the
protocol's limits is refused with an ``AgentError`` (4xx) that says which field
and why. Nothing here changes state, so a refused request changes nothing.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from agentq import protocol
from agentq.sidecar.attempts import AgentError

# A request body holds at most one report (MAX_REPORT_BYTES once encoded); leave room
# for JSON whitespace and escapes, and refuse anything bigger before reading it all.
MAX_BODY_BYTES = 4 * protocol.MAX_REPORT_BYTES
MAX_TOKEN = 2**63 - 1
MAX_WAIT_SECONDS = 60.0
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
# The id of a claim of another namespace's task: <namespace>~<task> (protocol.cross_claim_id).
_CROSS_ID = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?~[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_VERSION = re.compile(r"[0-9]{1,18}")


def bad(message: str, **details: Any) -> AgentError:
    return AgentError(400, "BadRequest", message, **details)


def too_large(message: str) -> AgentError:
    return AgentError(413, "PayloadTooLarge", message)


def unprocessable(message: str, **details: Any) -> AgentError:
    return AgentError(422, "Unprocessable", message, **details)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; NaN/Infinity, deep nesting and non-objects refused."""
    if len(raw) > MAX_BODY_BYTES:
        raise too_large(f"request body is {len(raw)} bytes; the limit is {MAX_BODY_BYTES}")
    if not raw.strip():
        raise bad("request body is empty; send a JSON object")
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise bad("request body is not UTF-8") from None
    except RecursionError:
        raise bad("request body is nested too deeply") from None
    except ValueError as err:
        raise bad(f"request body is not valid JSON: {err}") from None
    if not isinstance(body, dict):
        raise bad(f"request body must be a JSON object, not {type(body).__name__}")
    return body


def task_name(value: str) -> str:
    namespace, _, name = value.partition("~")
    plain = len(value) <= 253 and _NAME.fullmatch(value) is not None
    cross = len(namespace) <= 63 and len(name) <= 253 and _CROSS_ID.fullmatch(value) is not None
    if not (plain or cross):
        raise bad(
            f"{value[:100]!r} is not a task id (a task name: lowercase letters, digits, '-' "
            "and '.', at most 253 characters; or <namespace>~<task name>)"
        )
    return value


def _only(body: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise bad(
            f"unknown field(s) {', '.join(map(repr, unknown))}; "
            f"allowed: {', '.join(sorted(allowed))}",
            fields=unknown[:10],
        )


def _token(body: dict[str, Any]) -> int:
    if "token" not in body:
        raise bad("field 'token' is required: the fencing token of your assignment")
    token = body["token"]
    if isinstance(token, bool) or not isinstance(token, int):
        raise bad(f"field 'token' must be an integer, not {type(token).__name__}")
    if not 1 <= token <= MAX_TOKEN:
        raise bad(f"field 'token' must be between 1 and {MAX_TOKEN}")
    return token


def _string(body: dict[str, Any], field: str, *, limit: int, required: bool = False) -> str | None:
    value = body.get(field)
    if value is None:
        if required:
            raise bad(f"field {field!r} is required")
        return None
    if not isinstance(value, str):
        raise bad(f"field {field!r} must be a string, not {type(value).__name__}")
    if len(value) > limit:
        raise unprocessable(
            f"field {field!r} is {len(value)} characters; the limit is {limit}", field=field
        )
    return value


def invalid_usage(message: str) -> AgentError:
    return AgentError(400, "InvalidUsage", message, field="usage")


def invalid_throttle(message: str) -> AgentError:
    return AgentError(400, "InvalidThrottle", message, field="throttled")


@dataclass(frozen=True)
class ThrottleRequest:
    """A provider's 429 the agent reports: pause ``budget`` for ``retry_after`` seconds."""

    budget: str
    retry_after: float


def _usage(body: dict[str, Any]) -> dict[str, protocol.Usage] | None:
    """``usage`` as sent, its shape checked (the attempt's own checks come later:
    ``Attempts.check_usage``). Amounts left out are filled in there."""
    value = body.get("usage")
    if value is None:
        return None
    try:
        # Parsed against "no previous report": an amount left out reads as 0 here and is
        # taken from the attempt's previous report by ``Attempts.check_usage``.
        protocol.parse_usage(value, names=False)
    except protocol.ProtocolError as err:
        raise invalid_usage(str(err)) from None
    usage: dict[str, Any] = value
    return usage


def _throttle(body: dict[str, Any]) -> ThrottleRequest | None:
    value = body.get("throttled")
    if value is None:
        return None
    try:
        budget, seconds = protocol.parse_throttle(value, names=False)
    except protocol.ProtocolError as err:
        raise invalid_throttle(str(err)) from None
    return ThrottleRequest(budget, float(seconds))


def _check_json_value(value: Any) -> None:
    try:
        json.dumps(value, allow_nan=False)
    except (ValueError, RecursionError) as err:
        raise bad(f"field 'result' cannot be stored as JSON: {err}") from None


@dataclass(frozen=True)
class Heartbeat:
    token: int
    progress: str | None
    usage: dict[str, Any] | None = None  # as sent (shape checked)
    throttled: ThrottleRequest | None = None


def heartbeat(body: dict[str, Any]) -> Heartbeat:
    _only(body, {"token", "progress", "usage", "throttled"})
    token = _token(body)
    progress = _string(body, "progress", limit=protocol.MAX_PROGRESS_BYTES)
    if progress is not None:
        try:
            protocol.check_progress(progress)
        except protocol.ProtocolError as err:
            raise unprocessable(str(err), field="progress") from None
    return Heartbeat(token, progress, _usage(body), _throttle(body))


@dataclass(frozen=True)
class Completion:
    token: int
    result: Any
    result_ref: str | None
    usage: dict[str, Any] | None = None


def complete(body: dict[str, Any]) -> Completion:
    _only(body, {"token", "result", "resultRef", "usage"})
    token = _token(body)
    result = body.get("result")
    _check_json_value(result)
    ref = _string(body, "resultRef", limit=protocol.MAX_RESULT_REF_CHARS)
    return Completion(token, result, ref, _usage(body))


@dataclass(frozen=True)
class Failure:
    token: int
    error: protocol.ErrorInfo
    usage: dict[str, Any] | None = None
    throttled: ThrottleRequest | None = None


def fail(body: dict[str, Any]) -> Failure:
    _only(body, {"token", "reason", "message", "retryable", "usage", "throttled"})
    token = _token(body)
    reason = _string(body, "reason", limit=protocol.MAX_REASON_CHARS, required=True)
    if not reason or not reason.strip():
        raise bad("field 'reason' must not be empty: say why the attempt failed")
    message = _string(body, "message", limit=protocol.MAX_MESSAGE_CHARS) or ""
    retryable = body.get("retryable", True)
    if not isinstance(retryable, bool):
        raise bad(f"field 'retryable' must be true or false, not {type(retryable).__name__}")
    return Failure(
        token,
        protocol.ErrorInfo(reason=reason, message=message, retryable=retryable),
        _usage(body),
        _throttle(body),
    )


def wait_seconds(raw: str | None) -> float:
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise bad(f"query parameter 'wait' must be a number of seconds, not {raw[:50]!r}") from None
    if not math.isfinite(value) or not 0 <= value <= MAX_WAIT_SECONDS:
        raise bad(f"query parameter 'wait' must be between 0 and {MAX_WAIT_SECONDS:g}")
    return value


def after_version(raw: str | None) -> int | None:
    if raw is None:
        return None
    if not _VERSION.fullmatch(raw):
        raise bad(f"query parameter 'after' must be a version number, not {raw[:50]!r}")
    return int(raw)


# What a long poll with ``after`` waits for (``until``): any change of the listing, or
# only a new assignment (or one withdrawn before its report).
UNTIL_CHANGE = "change"
UNTIL_OFFERS = "offers"


def until(raw: str | None) -> str:
    if raw is None:
        return UNTIL_CHANGE
    if raw not in (UNTIL_CHANGE, UNTIL_OFFERS):
        raise bad(
            f"query parameter 'until' must be {UNTIL_CHANGE!r} or {UNTIL_OFFERS!r}, "
            f"not {raw[:50]!r}"
        )
    return raw


def encode_report(report: protocol.Report) -> str:
    """The report as the Lease annotation, or 413 if it is over the protocol's limit."""
    try:
        return report.encode()
    except protocol.ProtocolError as err:
        raise too_large(str(err)) from None
