"""Fuzzing the report decoder (``agentq.protocol``): what a Lease holder writes.

Properties, per the contract (coord/CONTRACT.md "Wire protocol decisions"):

- ``Report.decode`` raises nothing but ``ProtocolError``, whatever the text;
- what it accepts is strict: a token that is a JSON integer >= 1 (never a bool, a
  string or a float), a non-empty worker string, a known outcome, a resultRef that
  fits the status schema (4096), an error object of the right types, a result
  nested no deeper than the payload limit, a text no longer than MAX_REPORT_BYTES;
- a report encoded by ``Report.encode`` decodes to itself;
- deep input costs bounded work: no RecursionError, quick refusal;
- ``lease_token`` reads only what the operator writes (a canonical decimal >= 1).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agentq import protocol
from agentq.protocol import ErrorInfo, ProtocolError, Report

pytestmark = pytest.mark.unit

# The contract's limits (CONTRACT.md); read from protocol when it defines them.
MAX_RESULT_REF = int(getattr(protocol, "MAX_RESULT_REF_CHARS", 4096))
# How deep a report's result may nest: the protocol's JSON limit (the controller branch
# names it MAX_JSON_DEPTH), else the payload's (the lead's note: MAX_PAYLOAD_DEPTH, 64).
MAX_DEPTH = int(
    getattr(protocol, "MAX_JSON_DEPTH", None) or getattr(protocol, "MAX_PAYLOAD_DEPTH", 64)
)
OUTCOMES = ("Succeeded", "Failed")

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=16,
)
tokens = (
    st.integers(min_value=-3, max_value=2**64)
    | json_values
    | st.sampled_from([True, False, "1", "7", 1.0, 1.9, 2**63, None])
)
errors = json_values | st.fixed_dictionaries(
    {},
    optional={
        "reason": st.text(max_size=30) | json_values,
        "message": st.text(max_size=30) | json_values,
        "retryable": st.booleans() | json_values,
    },
)
report_like = st.fixed_dictionaries(
    {},
    optional={
        "token": tokens,
        "worker": st.sampled_from(["w", "", "worker-1"]) | json_values,
        "outcome": st.sampled_from([*OUTCOMES, "succeeded", "Maybe", ""]) | json_values,
        "result": json_values,
        "resultRef": st.text(max_size=50) | json_values | st.just("r" * 5000),
        "error": errors,
    },
)
texts = st.one_of(
    st.text(max_size=200),
    json_values.map(json.dumps),
    report_like.map(json.dumps),
    report_like.map(lambda body: json.dumps(body)[: max(1, len(json.dumps(body)) // 2)]),
)


def json_depth(value: Any) -> int:
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            depth += 1
            deepest = max(deepest, depth)
            stack.extend(
                (child, depth) for child in (item.values() if isinstance(item, dict) else item)
            )
    return deepest


def assert_strict(report: Report, text: str) -> None:
    assert type(report.token) is int and report.token >= 1, report.token
    assert isinstance(report.worker, str) and report.worker, report.worker
    assert report.outcome in OUTCOMES
    assert report.result_ref is None or (
        isinstance(report.result_ref, str) and len(report.result_ref) <= MAX_RESULT_REF
    )
    if report.error is not None:
        assert isinstance(report.error.reason, str)
        assert isinstance(report.error.message, str)
        assert type(report.error.retryable) is bool
    assert json_depth(report.result) <= MAX_DEPTH
    assert len(text.encode()) <= protocol.MAX_REPORT_BYTES


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(texts)
@example('{"token": true, "worker": "w", "outcome": "Succeeded"}')
@example('{"token": "1", "worker": "w", "outcome": "Succeeded"}')
@example('{"token": 1.9, "worker": "w", "outcome": "Succeeded"}')
@example('{"token": 1e400, "worker": "w", "outcome": "Succeeded"}')
@example('{"token": 1, "worker": 7, "outcome": "Failed", "error": {"retryable": "no"}}')
def test_decode_refuses_with_protocol_error_only_and_accepts_only_strict_reports(
    text: str,
) -> None:
    try:
        report = Report.decode(text)
    except ProtocolError:
        return
    assert_strict(report, text)


finite_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=16,
)
valid_reports = st.builds(
    Report,
    token=st.integers(min_value=1, max_value=2**63 - 1),
    worker=st.text(min_size=1, max_size=63),
    outcome=st.sampled_from(OUTCOMES),
    result=finite_json,
    result_ref=st.none() | st.text(max_size=200),
    error=st.none()
    | st.builds(
        ErrorInfo,
        reason=st.text(min_size=1, max_size=100),
        message=st.text(max_size=200),
        retryable=st.booleans(),
    ),
)


@settings(max_examples=300)
@given(valid_reports)
def test_an_encoded_report_decodes_to_itself(report: Report) -> None:
    try:
        text = report.encode()
    except ProtocolError:
        return  # over the size limit: refused at the source, with advice
    assert Report.decode(text) == report


DEEP = 100_000


@pytest.mark.parametrize(
    "text",
    [
        "[" * DEEP + "]" * DEEP,
        '{"a":' * DEEP + "1" + "}" * DEEP,
        '{"token": 1, "worker": "w", "outcome": "Succeeded", "result": '
        + "[" * DEEP
        + "]" * DEEP
        + "}",
        '{"token": 1, "worker": "w", "outcome": "Succeeded", "result": '
        + "[" * (MAX_DEPTH + 1)
        + "]" * (MAX_DEPTH + 1)
        + "}",
    ],
    ids=["deep-array", "deep-object", "deep-result", "result-just-over-the-limit"],
)
def test_deep_input_is_refused_quickly_without_recursion(text: str) -> None:
    started = time.monotonic()
    with pytest.raises(ProtocolError):
        Report.decode(text)
    assert time.monotonic() - started < 2.0


def test_a_report_over_the_size_limit_is_refused() -> None:
    text = json.dumps(
        {
            "token": 1,
            "worker": "w",
            "outcome": "Succeeded",
            "result": "x" * protocol.MAX_REPORT_BYTES,
        }
    )
    with pytest.raises(ProtocolError):
        Report.decode(text)


@settings(max_examples=300)
@given(st.text(max_size=30) | st.integers(-5, 2**70).map(str))
@example("1_0")
@example(" 7")
@example("+7")
@example("07")
@example("0")
@example("\u0663")  # ARABIC-INDIC DIGIT THREE: int() reads it as 3
def test_lease_token_reads_only_a_canonical_positive_decimal(raw: str) -> None:
    token = protocol.lease_token({protocol.ANNOTATION_TOKEN: raw})
    if token is not None:
        assert type(token) is int and token >= 1 and str(token) == raw


@given(st.text(max_size=30))
def test_lease_token_never_raises(raw: str) -> None:
    token = protocol.lease_token({protocol.ANNOTATION_TOKEN: raw})
    assert token is None or isinstance(token, int)
