"""The Lease wire protocol: reports round-trip, limits are clear, names stay valid."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentq import protocol


def test_reports_round_trip() -> None:
    report = protocol.Report(
        token=7,
        worker="w1",
        outcome="Failed",
        error=protocol.ErrorInfo(reason="Timeout", message="slow", retryable=False),
    )
    assert protocol.Report.decode(report.encode()) == report


def test_a_report_too_large_for_an_annotation_is_refused_with_advice() -> None:
    report = protocol.Report(token=1, worker="w", outcome="Succeeded", result="x" * 70_000)
    with pytest.raises(protocol.ProtocolError, match="resultRef"):
        report.encode()


@pytest.mark.parametrize(
    "text", ["not json", '{"token": 1}', '{"token":1,"worker":"w","outcome":"Maybe"}']
)
def test_unreadable_reports_raise(text: str) -> None:
    with pytest.raises(protocol.ProtocolError):
        protocol.Report.decode(text)


def test_long_names_become_valid_label_values_and_lease_names() -> None:
    name = "a" * 200
    assert len(protocol.label_value(name)) <= 63
    assert protocol.label_value(name) != protocol.label_value("a" * 199)
    assert len(protocol.task_lease_name("b" * 253)) <= 253
    assert protocol.task_lease_name("t1") == "agentq-task-t1"
    assert protocol.worker_lease_name("w1") == "agentq-worker-w1"


def test_lease_token_parsing() -> None:
    assert protocol.lease_token({protocol.ANNOTATION_TOKEN: "12"}) == 12
    assert protocol.lease_token({protocol.ANNOTATION_TOKEN: "x"}) is None
    assert protocol.lease_token(None) is None


@pytest.mark.parametrize("token", ["true", '"1"', "1.9", "1.0", "0", "-3", "null", "[1]", "1e3"])
def test_a_report_token_must_be_a_json_integer_of_at_least_one(token: str) -> None:
    """``int()`` used to coerce true, "1" and 1.9 into a committed token 1."""
    text = f'{{"token": {token}, "worker": "w", "outcome": "Succeeded"}}'
    with pytest.raises(protocol.ProtocolError, match="token"):
        protocol.Report.decode(text)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ('{"token": 1, "worker": 7, "outcome": "Succeeded"}', "worker"),
        ('{"token": 1, "worker": "", "outcome": "Succeeded"}', "worker"),
        ('{"token": 1, "worker": "w", "outcome": "Failed", "error": "x"}', "error"),
        (
            '{"token": 1, "worker": "w", "outcome": "Failed", "error": {"retryable": "no"}}',
            "retryable",
        ),
        ('{"token": 1, "worker": "w", "outcome": "Succeeded", "resultRef": 5}', "resultRef"),
        ("[1, 2]", "object"),
    ],
)
def test_reports_are_decoded_strictly(body: str, fragment: str) -> None:
    with pytest.raises(protocol.ProtocolError, match=fragment):
        protocol.Report.decode(body)


def test_a_result_ref_over_its_limit_and_a_result_too_deep_are_refused() -> None:
    ref = "s3://" + "x" * protocol.MAX_RESULT_REF_CHARS
    with pytest.raises(protocol.ProtocolError, match="resultRef"):
        protocol.Report.decode(
            f'{{"token": 1, "worker": "w", "outcome": "Succeeded", "resultRef": "{ref}"}}'
        )
    deep = "[" * 200 + "]" * 200
    with pytest.raises(protocol.ProtocolError, match="deeper"):
        protocol.Report.decode(
            f'{{"token": 1, "worker": "w", "outcome": "Succeeded", "result": {deep}}}'
        )
    deeper = "[" * 20_000 + "]" * 20_000  # beyond json.loads' recursion limit
    with pytest.raises(protocol.ProtocolError, match="deep"):
        protocol.Report.decode(
            f'{{"token": 1, "worker": "w", "outcome": "Succeeded", "result": {deeper}}}'
        )


def test_long_free_text_is_accepted_and_cut_when_copied() -> None:
    text = '{"token": 2, "worker": "w", "outcome": "Failed", "error": {"reason": "%s"}}' % (
        "r" * 2000
    )
    report = protocol.Report.decode(text)
    assert report.error is not None and len(report.error.reason) == 2000
    cut = protocol.bounded_text(report.error.reason, protocol.MAX_REASON_CHARS)
    assert len(cut) <= protocol.MAX_REASON_CHARS and cut.endswith("characters]")


@pytest.mark.parametrize(
    ("raw", "token"),
    [
        ("12", 12),
        ("1", 1),
        ("0", None),
        ("01", None),
        ("1.9", None),
        ("true", None),
        (" 1", None),
        ("+1", None),
        ("-1", None),
        ("", None),
        ("1" * 20, None),
        ("٣", None),
    ],
)
def test_token_annotations_are_plain_decimal_integers(raw: str, token: int | None) -> None:
    assert protocol.parse_token(raw) == token
    assert protocol.lease_token({protocol.ANNOTATION_TOKEN: raw}) == token


def test_json_depth_counts_without_recursion() -> None:
    assert protocol.json_depth(1) == 0
    assert protocol.json_depth({"a": [1, {"b": []}]}) == 4
    deep: object = []
    for _ in range(50_000):
        deep = [deep]
    assert protocol.json_depth(deep) == protocol.MAX_JSON_DEPTH + 1


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
_reportish = st.fixed_dictionaries(
    {},
    optional={
        "token": _json,
        "worker": _json,
        "outcome": st.sampled_from(["Succeeded", "Failed", "Maybe"]) | _json,
        "result": _json,
        "resultRef": _json,
        "error": _json
        | st.fixed_dictionaries(
            {}, optional={"reason": _json, "message": _json, "retryable": _json}
        ),
    },
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(_reportish.map(json.dumps), st.text(max_size=200)))
def test_decoding_any_text_gives_a_valid_report_or_a_protocol_error(text: str) -> None:
    try:
        report = protocol.Report.decode(text)
    except protocol.ProtocolError:
        return
    assert type(report.token) is int and report.token >= 1
    assert isinstance(report.worker, str) and report.worker
    assert report.outcome in ("Succeeded", "Failed")
    assert report.result_ref is None or len(report.result_ref) <= protocol.MAX_RESULT_REF_CHARS
    if report.error is not None:
        assert isinstance(report.error.retryable, bool)
