"""The Lease wire protocol: reports round-trip, limits are clear, names stay valid."""

from __future__ import annotations

import pytest

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
