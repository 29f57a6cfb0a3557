"""Usage and throttles from agents (docs/budgets.md): the protocol's parsers, the
sidecar's checks (400 InvalidUsage / InvalidThrottle, nothing written), and what goes
on the claim's Lease, in which write. The API server is ``FakeApi``, the clock a
``FakeClock``; the HTTP handlers are the real ones."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentq import protocol
from agentq.sidecar import agent_input
from agentq.sidecar.attempts import AgentError, Attempts
from harness import run
from sidecar_fakes import COMPLETE, Sidecar, agent, task_lease, wait_for

U = protocol.Usage
BEAT = "/v1/assignments/job/heartbeat"
FAIL = "/v1/assignments/job/fail"
BUDGETS = {"openai": (1, 1000), "search": (1, 0)}

# -- the protocol -------------------------------------------------------------------------


def test_usage_round_trips_and_fills_left_out_amounts_from_the_previous_report() -> None:
    usage = protocol.parse_usage({"openai": {"requests": 3, "tokens": 2500}, "search": {}})
    assert usage == {"openai": U(3, 2500), "search": U(0, 0)}
    assert protocol.decode_usage(protocol.encode_usage(usage)) == usage
    assert protocol.encode_usage(usage) == (
        '{"openai":{"requests":3,"tokens":2500},"search":{"requests":0,"tokens":0}}'
    )
    later = protocol.parse_usage({"openai": {"tokens": 2600}}, previous=usage)
    assert later == {"openai": U(3, 2600)}
    assert protocol.merge_usage(usage, later) == {"openai": U(3, 2600), "search": U(0, 0)}


BAD_USAGE = [
    ("not-an-object", [1], "object of budgets"),
    ("entry-not-an-object", {"openai": 3}, "object with requests"),
    ("negative", {"openai": {"requests": -1}}, "between 0"),
    ("float", {"openai": {"tokens": 1.0}}, "integer"),
    ("bool", {"openai": {"requests": True}}, "integer"),
    ("string", {"openai": {"tokens": "5"}}, "integer"),
    ("requests-absurd", {"openai": {"requests": 10**9 + 1}}, "between 0 and 1000000000"),
    ("tokens-absurd", {"openai": {"tokens": 10**12 + 1}}, "between 0 and 1000000000000"),
    ("unknown-field", {"openai": {"requests": 1, "cost": 2}}, "unknown field"),
    ("bad-name", {"Open AI": {"requests": 1}}, "not a budget's name"),
    ("long-name", {"b" * 64: {"requests": 1}}, "not a budget's name"),
    ("too-many", {f"b{i}": {} for i in range(9)}, "at most 8"),
]


@pytest.mark.parametrize(
    ("value", "match"), [c[1:] for c in BAD_USAGE], ids=[c[0] for c in BAD_USAGE]
)
def test_bad_usage_is_refused_with_a_reason(value: Any, match: str) -> None:
    with pytest.raises(protocol.ProtocolError, match=match):
        protocol.parse_usage(value)


def test_usage_lower_than_before_or_for_a_budget_not_named_is_refused() -> None:
    before = {"openai": U(3, 2500)}
    with pytest.raises(protocol.ProtocolError, match="lower than"):
        protocol.merge_usage(before, {"openai": U(3, 2499)}, named={"openai"})
    with pytest.raises(protocol.ProtocolError, match="does not name"):
        protocol.merge_usage(before, {"anthropic": U(1, 0)}, named={"openai"})
    assert protocol.merge_usage(before, {"openai": U(3, 2500)}, named={"openai"}) == before


BAD_THROTTLES = [
    ("zero", {"budget": "openai", "retryAfterSeconds": 0}),
    ("negative", {"budget": "openai", "retryAfterSeconds": -5}),
    ("over-an-hour", {"budget": "openai", "retryAfterSeconds": 3600.5}),
    ("string", {"budget": "openai", "retryAfterSeconds": "10"}),
    ("bool", {"budget": "openai", "retryAfterSeconds": True}),
    ("no-seconds", {"budget": "openai"}),
    ("no-budget", {"retryAfterSeconds": 10}),
    ("bad-budget", {"budget": "", "retryAfterSeconds": 10}),
    ("unknown-field", {"budget": "openai", "retryAfterSeconds": 10, "until": 5}),
    ("not-an-object", "openai"),
]


@pytest.mark.parametrize("value", [c[1] for c in BAD_THROTTLES], ids=[c[0] for c in BAD_THROTTLES])
def test_bad_throttles_are_refused(value: Any) -> None:
    with pytest.raises(protocol.ProtocolError):
        protocol.parse_throttle(value)


def test_throttles_round_trip_and_the_lease_readers_are_lenient() -> None:
    assert protocol.parse_throttle({"budget": "openai", "retryAfterSeconds": 3600}) == (
        "openai",
        3600,
    )
    throttle = protocol.Throttle("openai", 10.5, "7-abc")
    assert protocol.Throttle.decode(throttle.encode()) == throttle
    assert json.loads(throttle.encode()) == {
        "budget": "openai",
        "retryAfterSeconds": 10.5,
        "id": "7-abc",
    }
    good = {protocol.ANNOTATION_THROTTLED: throttle.encode(), protocol.ANNOTATION_USAGE: "{}"}
    assert protocol.lease_throttle(good) == throttle
    assert protocol.lease_usage(good) == {}
    bad = {protocol.ANNOTATION_THROTTLED: '{"budget": "x"}', protocol.ANNOTATION_USAGE: "[1]"}
    assert protocol.lease_throttle(bad) is None and protocol.lease_usage(bad) is None
    assert protocol.lease_throttle(None) is None and protocol.lease_usage({}) is None
    with pytest.raises(protocol.ProtocolError, match="id"):
        protocol.Throttle.decode('{"budget": "openai", "retryAfterSeconds": 1}')


def test_a_report_carries_its_final_usage() -> None:
    report = protocol.Report(token=7, worker="w", outcome="Succeeded", usage={"openai": U(2, 9)})
    assert json.loads(report.encode())["usage"] == {"openai": {"requests": 2, "tokens": 9}}
    assert protocol.Report.decode(report.encode()) == report
    plain = protocol.Report(token=7, worker="w", outcome="Succeeded")
    assert "usage" not in json.loads(plain.encode())
    with pytest.raises(protocol.ProtocolError):
        protocol.Report.decode('{"token": 7, "worker": "w", "outcome": "Failed", "usage": 5}')


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["openai", "search", "a.b-c"]),
        st.fixed_dictionaries(
            {},
            optional={
                "requests": st.integers(-2, protocol.MAX_USAGE_REQUESTS + 2),
                "tokens": st.integers(-2, protocol.MAX_USAGE_TOKENS + 2),
            },
        ),
    )
)
def test_whatever_parses_encodes_back_to_itself(value: dict[str, Any]) -> None:
    try:
        usage = protocol.parse_usage(value)
    except protocol.ProtocolError:
        assert any(
            not 0
            <= v
            <= (protocol.MAX_USAGE_REQUESTS if k == "requests" else protocol.MAX_USAGE_TOKENS)
            for entry in value.values()
            for k, v in entry.items()
        )
        return
    assert protocol.decode_usage(protocol.encode_usage(usage)) == usage


# -- the sidecar's input checks ------------------------------------------------------------


def test_the_request_bodies_take_usage_and_throttled_where_the_api_says() -> None:
    beat = agent_input.heartbeat(
        {
            "token": 7,
            "usage": {"openai": {"requests": 1}},
            "throttled": {"budget": "openai", "retryAfterSeconds": 5},
        }
    )
    assert beat.usage == {"openai": {"requests": 1}}
    assert beat.throttled == agent_input.ThrottleRequest("openai", 5.0)
    assert agent_input.complete({"token": 7, "usage": {}}).usage == {}
    failed = agent_input.fail(
        {"token": 7, "reason": "RateLimited", "throttled": {"budget": "x", "retryAfterSeconds": 1}}
    )
    assert failed.throttled == agent_input.ThrottleRequest("x", 1.0)
    with pytest.raises(AgentError) as refused:
        agent_input.complete({"token": 7, "throttled": {"budget": "x", "retryAfterSeconds": 1}})
    assert refused.value.code == "BadRequest"  # complete takes no throttle
    with pytest.raises(AgentError) as refused:
        agent_input.heartbeat({"token": 7, "usage": {"openai": {"tokens": -1}}})
    assert (refused.value.status, refused.value.code) == (400, "InvalidUsage")
    with pytest.raises(AgentError) as refused:
        agent_input.fail(
            {"token": 7, "reason": "r", "throttled": {"budget": "x", "retryAfterSeconds": 0}}
        )
    assert (refused.value.status, refused.value.code) == (400, "InvalidThrottle")


def test_a_restarted_sidecar_takes_the_reported_usage_back_from_the_lease() -> None:
    lease = task_lease()
    lease["metadata"]["annotations"][protocol.ANNOTATION_USAGE] = (
        '{"openai":{"requests":2,"tokens":50}}'
    )
    attempts = Attempts(namespace="ns", worker="w")
    attempt = attempts.observe(lease, 0.0)
    assert attempt is not None and attempt.usage == {"openai": U(2, 50)}
    attempts.activate(
        attempt, uid=None, payload=None, lease_seconds=30, heartbeat_seconds=10, budgets=BUDGETS
    )
    with pytest.raises(AgentError, match="lower than"):
        attempt.check_usage({"openai": {"tokens": 49}})


# -- the sidecar over a fake API server --------------------------------------------------------


def annotations(sidecar: Sidecar) -> dict[str, str]:
    return dict(sidecar.lease()["metadata"].get("annotations") or {})


def puts(sidecar: Sidecar) -> int:
    return sidecar.api.requests[("PUT", "leases")]


async def beating(sidecar: Sidecar, client: Any, intervals: int, body: Any) -> None:
    """The agent beats once per heartbeat interval (10 s) for ``intervals`` intervals,
    ``body(i)`` its request; the renewal loop runs and renews what is due."""
    stop = asyncio.Event()
    loop = asyncio.create_task(sidecar.renewer.run(stop))
    try:
        for i in range(intervals):
            sidecar.clock.advance(10.0)
            sidecar.keeper.confirmed_at = sidecar.clock.monotonic()
            sent = await client.post(BEAT, json=body(i))
            assert sent.status == 200, await sent.json()
            renewals = sidecar.renewer.renewals
            await wait_for(lambda n=renewals: sidecar.renewer.renewals > n)
    finally:
        stop.set()
        sidecar.changes.notify()
        await loop


@run
async def test_usage_rides_the_renewals_and_costs_no_write_of_its_own() -> None:
    counts = []
    for with_usage in (False, True):
        sidecar = Sidecar()
        sidecar.hold_worker_lease()
        sidecar.grant(budgets=BUDGETS)
        client = await agent(sidecar)
        try:

            def body(i: int, with_usage: bool = with_usage) -> dict[str, Any]:
                beat: dict[str, Any] = {"token": 7, "progress": f"step {i}"}
                if with_usage:
                    beat["usage"] = {"openai": {"requests": i + 1, "tokens": 100 * (i + 1)}}
                return beat

            await beating(sidecar, client, 5, body)
            counts.append(puts(sidecar))
            if with_usage:
                assert json.loads(annotations(sidecar)[protocol.ANNOTATION_USAGE]) == {
                    "openai": {"requests": 5, "tokens": 500}
                }
                # The agent sees what it reported so far, and what its task estimated.
                got = await (await client.get("/v1/assignments/job")).json()
                assert got["usage"] == {"openai": {"requests": 5, "tokens": 500}}
                assert got["budgets"] == [
                    {"name": "openai", "requests": 1, "tokens": 1000},
                    {"name": "search", "requests": 1, "tokens": 0},
                ]
            else:
                assert protocol.ANNOTATION_USAGE not in annotations(sidecar)
        finally:
            await client.close()
    assert counts[0] == counts[1] == 5  # one write per renewal, usage or not


@run
async def test_a_throttle_is_written_at_once_each_with_an_id_of_its_own() -> None:
    sidecar = Sidecar()
    sidecar.hold_worker_lease()
    sidecar.grant(budgets=BUDGETS)
    client = await agent(sidecar)
    await beating(sidecar, client, 1, lambda i: {"token": 7})
    stop = asyncio.Event()
    loop = asyncio.create_task(sidecar.renewer.run(stop))

    def written() -> protocol.Throttle | None:
        return protocol.lease_throttle(annotations(sidecar))

    try:
        before = puts(sidecar)
        ids = []
        for seconds in (10, 20):
            sent = await client.post(
                BEAT,
                json={"token": 7, "throttled": {"budget": "openai", "retryAfterSeconds": seconds}},
            )
            assert sent.status == 200
            await wait_for(
                lambda s=seconds: (w := written()) is not None and w.retry_after_seconds == s
            )
            ids.append(written().id)  # type: ignore[union-attr]
        assert puts(sidecar) == before + 2  # no clock moved: written for the throttles
        assert len(set(ids)) == 2 and all(i.startswith("7-") for i in ids)
        assert sidecar.attempts.current["job"].throttles == []
    finally:
        stop.set()
        sidecar.changes.notify()
        await loop
        await client.close()


def bad_reports() -> list[tuple[str, str, dict[str, Any], str]]:
    """(id, path, body, error code), each refused once the attempt reported
    openai: requests 2, tokens 200."""
    throttle = {"budget": "openai", "retryAfterSeconds": 10}
    return [
        ("negative", BEAT, {"usage": {"openai": {"tokens": -1}}}, "InvalidUsage"),
        ("float", BEAT, {"usage": {"openai": {"tokens": 300.0}}}, "InvalidUsage"),
        ("absurd-requests", BEAT, {"usage": {"openai": {"requests": 10**9 + 1}}}, "InvalidUsage"),
        ("absurd-tokens", COMPLETE, {"usage": {"openai": {"tokens": 10**12 + 1}}}, "InvalidUsage"),
        ("lower", BEAT, {"usage": {"openai": {"requests": 2, "tokens": 199}}}, "InvalidUsage"),
        ("lower-at-the-end", COMPLETE, {"usage": {"openai": {"requests": 1}}}, "InvalidUsage"),
        ("not-named", BEAT, {"usage": {"anthropic": {"requests": 1}}}, "InvalidUsage"),
        ("not-named-fail", FAIL, {"reason": "r", "usage": {"x": {}}}, "InvalidUsage"),
        (
            "throttle-zero",
            BEAT,
            {"throttled": {**throttle, "retryAfterSeconds": 0}},
            "InvalidThrottle",
        ),
        (
            "throttle-long",
            FAIL,
            {"reason": "r", "throttled": {**throttle, "retryAfterSeconds": 3601}},
            "InvalidThrottle",
        ),
        (
            "throttle-not-named",
            BEAT,
            {"throttled": {**throttle, "budget": "anthropic"}},
            "InvalidThrottle",
        ),
        # A good throttle with bad usage: neither is taken.
        ("both", BEAT, {"throttled": throttle, "usage": {"openai": {"tokens": 1}}}, "InvalidUsage"),
    ]


@pytest.mark.parametrize(
    ("path", "body", "code"), [c[1:] for c in bad_reports()], ids=[c[0] for c in bad_reports()]
)
@run
async def test_a_bad_report_is_refused_and_nothing_reaches_the_lease(
    path: str, body: dict[str, Any], code: str
) -> None:
    sidecar = Sidecar()
    sidecar.hold_worker_lease()
    attempt = sidecar.grant(budgets=BUDGETS)
    client = await agent(sidecar)
    try:
        await beating(
            sidecar,
            client,
            1,
            lambda i: {"token": 7, "usage": {"openai": {"requests": 2, "tokens": 200}}},
        )
        lease = sidecar.lease()
        writes = puts(sidecar)
        sent = await client.post(path, json={"token": 7, **body})
        answer = await sent.json()
        assert (sent.status, answer["error"]) == (400, code), answer
        assert answer["field"] == ("usage" if code == "InvalidUsage" else "throttled")
        await asyncio.sleep(0.05)
        assert sidecar.lease() == lease and puts(sidecar) == writes
        assert attempt.usage == {"openai": U(2, 200)} and attempt.throttles == []
        assert attempt.state == "active"
    finally:
        await client.close()


@run
async def test_the_report_carries_the_final_usage_and_a_failure_its_throttle() -> None:
    for path, extra in ((COMPLETE, {}), (FAIL, {"reason": "RateLimited"})):
        sidecar = Sidecar()
        sidecar.hold_worker_lease()
        sidecar.grant(budgets=BUDGETS)
        client = await agent(sidecar)
        try:
            await beating(
                sidecar, client, 1, lambda i: {"token": 7, "usage": {"search": {"requests": 4}}}
            )
            body: dict[str, Any] = {
                "token": 7,
                "usage": {"openai": {"requests": 3, "tokens": 900}},
                **extra,
            }
            if path == FAIL:
                body["throttled"] = {"budget": "openai", "retryAfterSeconds": 30}
            sent = await client.post(path, json=body)
            assert sent.status == 200, await sent.json()
            final = {
                "openai": {"requests": 3, "tokens": 900},
                "search": {"requests": 4, "tokens": 0},
            }
            notes = annotations(sidecar)
            assert json.loads(notes[protocol.ANNOTATION_REPORT])["usage"] == final
            assert json.loads(notes[protocol.ANNOTATION_USAGE]) == final
            assert protocol.Report.decode(notes[protocol.ANNOTATION_REPORT]).usage == {
                "openai": U(3, 900),
                "search": U(4, 0),
            }
            if path == FAIL:
                throttle = protocol.Throttle.decode(notes[protocol.ANNOTATION_THROTTLED])
                assert (throttle.budget, throttle.retry_after_seconds) == ("openai", 30)
            else:
                assert protocol.ANNOTATION_THROTTLED not in notes
            again = await client.post(path, json=body)  # a retry: the same report
            assert again.status == 200, await again.json()
        finally:
            await client.close()
