"""Agents in Go and TypeScript (examples/agents) against real sidecars, the operator and
the real API server: each is a real process beside a real ``agentq sidecar``, talking to
it over HTTP with the pod's secret, as the agent container of a pod would.

For each language: an assignment, heartbeats with progress (read back from the task's
status and its Lease), a task completed and one failed (phase and reason read back),
a claim revoked by a cancel (409 ``Cancelled``, the sink fenced with its token), and a
frozen attempt that wakes up after its lease was lost: its fenced write is refused for
a stale token and the sidecar answers 409 ``LeaseLost``. The sink is one SQLite file in
agentq.fencing's table, read back here with the Python store (and written by it too:
the three languages fence each other). Then each language's own unit tests, and a check
that the types generated from docs/agent-api.openapi.yaml are up to date.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import polyglot
from agentq import GROUP, VERSION, protocol
from agentq.fencing import StaleTokenError, open_store
from builders import task, worker
from fleet import AgentPair, Fleet, Process

LEASE = 3


@pytest.fixture(params=polyglot.LANGS)
def lang(request: pytest.FixtureRequest) -> str:
    polyglot.require(request.param)
    return str(request.param)


def start(fleet: Fleet, name: str, lang: str, sink: str, *flags: str) -> AgentPair:
    """A sidecar for worker ``name`` and the example agent in ``lang`` beside it."""
    argv = polyglot.agent_argv(lang)
    return fleet.agent(
        name,
        program=lambda url, token_file: [
            *argv,
            "--sidecar",
            url,
            "--token-file",
            str(token_file),
            "--sink",
            sink,
            *flags,
        ],
    )


def wait_event(
    proc: Process, predicate: Callable[[dict[str, Any]], bool], *, timeout: float, what: str
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        for event in proc.events():
            if predicate(event):
                return event
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not in {proc.log.name} after {timeout}s:\n{proc.text()}")
        time.sleep(0.1)


def progress(body: dict[str, Any]) -> str:
    return str((body.get("status") or {}).get("progress") or "")


def test_the_agent_completes_fails_beats_with_progress_and_stops_when_revoked(
    fleet: Fleet, tmp_path: Path, lang: str
) -> None:
    sink = f"sqlite://{tmp_path / 'sink.db'}"
    fleet.add_worker(worker("w").capabilities("llm").max_in_flight(3))
    pair = start(fleet, "w", lang, sink)
    fleet.operator()
    fleet.add_task(task("ok").requires("llm").payload({"steps": 3, "stepSeconds": 0.3}))
    fleet.add_task(
        task("bad")
        .requires("llm")
        .payload({"action": "fatal", "reason": "ToolError", "message": "git clone failed"})
    )
    fleet.add_task(task("long").requires("llm").lease(LEASE).payload({"action": "hold"}))

    # Completed: the result, the reference to the sink, one attempt.
    ok = fleet.wait_phase("ok", "Succeeded", timeout=60)["status"]
    assert ok["result"] == {"by": "w", "lang": lang, "steps": 3}
    assert ok["resultRef"] == f"{sink}#agentq_fenced/ok"
    assert ok["attempt"] == 1 and ok["reclaims"] == 0
    # Failed, not retryable: phase and reason read back.
    bad = fleet.wait_phase("bad", "Failed", timeout=60)["status"]
    assert bad["error"]["reason"] == "ToolError"
    assert "git clone failed" in bad["error"]["message"]
    assert bad["attempt"] == 1

    # Heartbeats with progress: the marker reaches the task's status and its Lease, and moves.
    running = fleet.wait_task(
        "long", lambda b: progress(b).startswith("step-"), timeout=30, what="progress"
    )
    first_marker = progress(running)
    token = int(running["status"]["fencingToken"])
    lease = fleet.task_lease("long")
    assert lease is not None
    assert (lease.metadata.annotations or {})[protocol.ANNOTATION_PROGRESS].startswith("step-")
    fleet.wait_task(
        "long",
        lambda b: progress(b).startswith("step-") and progress(b) != first_marker,
        timeout=30,
        what="progress moving",
    )
    assert fleet.task("long")["status"]["phase"] == "Running"

    # A cancel revokes the claim: the agent's next heartbeat gets 409 Cancelled with a fence
    # token above its own, which it writes into its sink before it stops.
    fleet.custom.patch_namespaced_custom_object(
        GROUP, VERSION, fleet.namespace, "agenttasks", "long", {"spec": {"cancel": True}}
    )
    revoked = wait_event(
        pair.agent,
        lambda e: e["event"] == "revoked" and e["task"] == "long",
        timeout=30,
        what="the 409 of the cancel",
    )
    assert revoked["status"] == 409 and revoked["code"] == "Cancelled"
    assert revoked["token"] == token and revoked["fence"] > token
    cancelled = fleet.wait_phase("long", "Cancelled", timeout=30)["status"]
    assert cancelled["phase"] == "Cancelled"

    # The sink, read (and written) with the Python store: the same table and rule.
    with open_store(sink) as store:
        rows = {r.key: r for r in store.records()}
        assert rows["ok"].token == ok["fencingToken"]
        assert rows["ok"].value["lang"] == lang and rows["ok"].value["by"] == "w"
        assert rows["ok"].revision == 2  # fenced at the start, written at the end
        assert rows["bad"].token == bad["fencingToken"]
        assert rows["long"].token == revoked["fence"]
        with pytest.raises(StaleTokenError):
            store.write("long", token, "the revoked attempt's late output")
    reported = sorted(
        (e["task"], e["outcome"]) for e in pair.agent.events() if e["event"] == "reported"
    )
    assert reported == [("bad", "Failed"), ("ok", "Succeeded")]
    assert not [e for e in pair.agent.events() if e["event"] == "error"], pair.agent.text()


def test_a_frozen_attempt_wakes_up_refused_at_the_sink_and_by_a_409(
    fleet: Fleet, tmp_path: Path, lang: str
) -> None:
    """A worker frozen mid-task (SIGSTOP) and resumed after another attempt won: its
    fenced write carries a stale token and is refused, and the sidecar answers 409."""
    sink = f"sqlite://{tmp_path / 'sink.db'}"
    fleet.add_worker(worker("a").capabilities("llm"))
    # a works slowly (30 blocking steps of 0.5 s), b quickly: the payload is the same.
    pair_a = start(fleet, "a", lang, sink, "--step-seconds", "0.5")
    fleet.operator()
    payload = {"steps": 30, "stepSeconds": 0.05, "blocking": True}
    fleet.add_task(task("job").requires("llm").lease(LEASE).backoff(initial=0).payload(payload))
    first = fleet.wait_phase("job", "Running", timeout=60)["status"]
    assert first["worker"] == "a"
    wait_event(
        pair_a.agent, lambda e: e["event"] == "sink-fenced", timeout=30, what="a fenced its key"
    )
    # Frozen at once, well inside its 15 s of work, however long b then takes to start.
    pair_a.agent.signal(signal.SIGSTOP)
    try:
        fleet.add_worker(worker("b").capabilities("llm"))
        pair_b = start(fleet, "b", lang, sink)
        done = fleet.wait_phase("job", "Succeeded", timeout=LEASE + 60)["status"]
    finally:
        pair_a.agent.signal(signal.SIGCONT)
    # a's sidecar lives on, Ready, so a retry may go back to a (whose frozen agent cannot
    # take it) before it reaches b: every attempt before b's expired.
    assert done["worker"] == "b" and done["fencingToken"] > first["fencingToken"]
    earlier = [h for h in done["history"] if h["token"] != done["fencingToken"]]
    assert {(h["worker"], h["reason"]) for h in earlier} == {("a", "LeaseExpired")}

    # The zombie wakes up, finishes its work and tries to publish it: refused twice.
    refused = wait_event(
        pair_a.agent, lambda e: e["event"] == "sink-refused", timeout=40, what="sink refusal"
    )
    assert refused["token"] == first["fencingToken"]
    assert refused["highest"] == done["fencingToken"]
    lost = wait_event(pair_a.agent, lambda e: e["event"] == "lost", timeout=30, what="the 409")
    assert lost["token"] == first["fencingToken"]
    assert lost["status"] == 409 and lost["code"] == "LeaseLost", lost
    assert not [e for e in pair_a.agent.events() if e["event"] == "reported"]

    # One attempt's output is visible: b's, with the committed token.
    with open_store(sink) as store:
        record = store.read("job")
    assert record is not None and record.token == done["fencingToken"]
    assert record.value["by"] == "b" and record.value["lang"] == lang
    final = fleet.task("job")["status"]
    assert final["phase"] == "Succeeded" and final["result"]["by"] == "b"
    assert pair_b.agent.popen.poll() is None


def test_the_agents_own_unit_tests_pass(lang: str) -> None:
    """go test (the client against a stand-in sidecar, the fenced store with concurrent
    writers) and node's test runner (the same for TypeScript)."""
    if lang == "go":
        out = polyglot.run(["go", "test", "-count=1", "./..."], polyglot.GO_DIR)
        assert "FAIL" not in out and "ok  \tagentq.dev/examples/agents/go/fencing" in out, out
    else:
        polyglot.agent_argv("ts")  # compiled, the tests with it
        out = polyglot.run(["node", "--test", "dist/test/"], polyglot.TS_DIR)
        assert "# fail 0" in out and "# pass 0" not in out, out


def test_the_generated_types_match_the_openapi_file(tmp_path: Path) -> None:
    """types.gen.go and api.gen.ts are what the pinned generators make of
    docs/agent-api.openapi.yaml now: a change of the API that was not regenerated
    (make polyglot-generate) fails here."""
    for lang in polyglot.LANGS:
        polyglot.require(lang)
    polyglot.run([str(polyglot.AGENTS / "generate.sh"), str(tmp_path)], polyglot.AGENTS)
    for generated, committed in (
        ("types.gen.go", polyglot.GO_DIR / "sidecar" / "types.gen.go"),
        ("api.gen.ts", polyglot.TS_DIR / "src" / "api.gen.ts"),
    ):
        assert (tmp_path / generated).read_text() == committed.read_text(), (
            f"{committed.relative_to(polyglot.ROOT)} is out of date: make polyglot-generate"
        )
