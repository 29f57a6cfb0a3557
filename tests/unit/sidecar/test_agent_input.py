"""Strict reading of agent requests: every malformed input is a 4xx AgentError, never a crash."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentq import protocol
from agentq.sidecar import agent_input
from agentq.sidecar.attempts import AgentError


def test_well_formed_requests_are_read() -> None:
    beat = agent_input.heartbeat({"token": 3, "progress": "half"})
    assert (beat.token, beat.progress) == (3, "half")
    done = agent_input.complete({"token": 3, "result": {"a": [1]}, "resultRef": "s3://x"})
    assert (done.result, done.result_ref) == ({"a": [1]}, "s3://x")
    failed = agent_input.fail({"token": 3, "reason": "ToolError", "retryable": False})
    assert failed.error == protocol.ErrorInfo("ToolError", "", False)


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"", 400),
        (b"   ", 400),
        (b"{", 400),
        (b"[]", 400),
        (b'"token"', 400),
        (b"\xff\xfe", 400),
        (b'{"token": NaN}', 400),
        (b'{"token": Infinity}', 400),
        (b"[" * 50_000 + b"]" * 50_000, 400),
        (b"{}" + b" " * agent_input.MAX_BODY_BYTES, 413),
    ],
)
def test_bodies_that_are_not_a_json_object_are_refused(raw: bytes, status: int) -> None:
    with pytest.raises(AgentError) as refused:
        agent_input.parse_json(raw)
    assert refused.value.status == status


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"token": "1"},
        {"token": 1.0},
        {"token": True},
        {"token": 0},
        {"token": -5},
        {"token": 2**63},
        {"token": None},
        {"token": 1, "extra": 1},
    ],
)
def test_a_token_must_be_a_positive_64_bit_integer_and_fields_known(body: dict) -> None:
    with pytest.raises(AgentError) as refused:
        agent_input.heartbeat(body)
    assert refused.value.status == 400


def test_limits_are_the_protocols() -> None:
    over = "x" * (protocol.MAX_PROGRESS_BYTES + 1)
    with pytest.raises(AgentError) as progress:
        agent_input.heartbeat({"token": 1, "progress": over})
    assert progress.value.status == 422
    with pytest.raises(AgentError):  # bytes, not characters
        agent_input.heartbeat(
            {"token": 1, "progress": "é" * (protocol.MAX_PROGRESS_BYTES // 2 + 1)}
        )
    with pytest.raises(AgentError) as reason:
        agent_input.fail({"token": 1, "reason": "r" * (protocol.MAX_REASON_CHARS + 1)})
    assert reason.value.status == 422
    with pytest.raises(AgentError):
        agent_input.fail({"token": 1, "reason": "r", "message": "m" * 32769})
    with pytest.raises(AgentError):
        agent_input.complete({"token": 1, "resultRef": "r" * (protocol.MAX_RESULT_REF_CHARS + 1)})
    report = protocol.Report(token=1, worker="w", outcome="Succeeded", result="z" * 70_000)
    with pytest.raises(AgentError) as big:
        agent_input.encode_report(report)
    assert big.value.status == 413 and "resultRef" in big.value.message


@pytest.mark.parametrize("value", ["-1", "61", "nan", "inf", "x", ""])
def test_wait_is_a_number_of_seconds_up_to_a_minute(value: str) -> None:
    with pytest.raises(AgentError):
        agent_input.wait_seconds(value)


@pytest.mark.parametrize("value", ["-1", "1.5", "x", "1" * 19, "²", "1\n"])
def test_after_is_a_version_number(value: str) -> None:
    with pytest.raises(AgentError):
        agent_input.after_version(value)


@pytest.mark.parametrize("name", ["", "UPPER", "-lead", "trail-", "a/b", "x" * 254, "a\n"])
def test_task_names_are_checked(name: str) -> None:
    with pytest.raises(AgentError):
        agent_input.task_name(name)


@given(st.binary(max_size=2000))
def test_no_bytes_crash_the_reader(raw: bytes) -> None:
    try:
        body = agent_input.parse_json(raw)
    except AgentError as err:
        assert 400 <= err.status < 500
        return
    for read in (agent_input.heartbeat, agent_input.complete, agent_input.fail):
        try:
            read(body)
        except AgentError as err:
            assert 400 <= err.status < 500


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(), st.lists, max_leaves=20))
def test_any_json_result_is_accepted_or_refused_cleanly(value: object) -> None:
    body = json.loads(json.dumps({"token": 1, "result": value}))
    assert agent_input.complete(body).result == value
