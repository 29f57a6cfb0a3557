"""agentq.agent, the agent's client, against a tiny fake sidecar (a local HTTP server
of the test's own, answering as the real one does): heartbeats from a background
thread, LeaseLost raised in the agent when fenced."""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agentq.agent import (
    AgentError,
    Assignment,
    Cancelled,
    LeaseLost,
    SidecarClient,
    SidecarUnavailable,
)
from agentq.fencing import SQLiteFencedStore, StaleTokenError


class FakeSidecar:
    def __init__(self, *, keep_alive: bool = False) -> None:
        self.beats: list[dict[str, Any]] = []
        self.lost_after: int | None = None  # answer 409 from this beat on
        self.lost_body: dict[str, Any] = {"error": "LeaseLost", "message": "reclaimed"}
        self.reports: list[tuple[str, dict[str, Any]]] = []
        self.remaining = 30.0
        self.unavailable_reports = 0  # answer this many reports 503 (the API server away)
        self.cut_beat: int | None = None  # cut the answer to this heartbeat (1-based) short
        self.cut_reports = 0  # cut the answer to this many reports short
        self.listings: list[list[dict[str, Any]]] = []  # answers to GET, in order (the last stays)
        self.failed_listings = 0  # answer this many GETs 500 (a bug in the sidecar, say)
        self.secret: str | None = None  # when set, every call must carry it (else 401)
        self.authorizations: list[str | None] = []  # the Authorization header of each call
        self.paths: list[str] = []  # the path (and query) of each GET
        self.connections = 0  # connections accepted
        self.sockets: list[socket.socket] = []  # their server ends
        self.drop_idle = False  # close each connection after its answer, without saying so
        self.refuse_until = False  # answer ``until`` 400, as a sidecar that predates it
        self.refuse_usage = False  # answer a heartbeat with usage 400 InvalidUsage
        fake = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.1 keeps the connection open after an answer (keep-alive); 1.0 closes it.
            protocol_version = "HTTP/1.1" if keep_alive else "HTTP/1.0"

            def setup(self) -> None:
                super().setup()
                with fake.lock:
                    fake.connections += 1
                    fake.sockets.append(self.connection)

            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
                if fake.drop_idle:
                    self.close_connection = True

            def _refused(self) -> bool:
                header = self.headers.get("Authorization")
                fake.authorizations.append(header)
                if fake.secret is None or header == f"Bearer {fake.secret}":
                    return False
                self._answer(401, {"error": "Unauthorized", "message": "the secret is wrong"})
                return True

            def do_GET(self) -> None:
                fake.paths.append(self.path)
                if self._refused():
                    return
                if fake.refuse_until and "until=" in self.path:
                    self._answer(400, {"error": "BadRequest", "message": "unknown: 'until'"})
                    return
                if fake.failed_listings > 0:
                    fake.failed_listings -= 1
                    self._answer(500, {"error": "Internal", "message": "unexpected"})
                    return
                if not fake.listings:
                    self._answer(200, {"version": 1, "assignments": [ASSIGNMENT]})
                    return
                items = fake.listings.pop(0) if len(fake.listings) > 1 else fake.listings[0]
                self._answer(200, {"version": 1 + len(fake.listings), "assignments": items})

            def _cut(self) -> None:
                """An answer whose body ends early: the sidecar went away mid-answer."""
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "1000")
                self.end_headers()
                self.wfile.write(b'{"task": ')
                self.close_connection = True

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self._refused():
                    return
                if self.path.endswith("/heartbeat"):
                    fake.beats.append(body)
                    if fake.refuse_usage and "usage" in body:
                        self._answer(400, {"error": "InvalidUsage", "message": "lower"})
                        return
                    if len(fake.beats) == fake.cut_beat:
                        self._cut()
                        return
                    if fake.lost_after is not None and len(fake.beats) >= fake.lost_after:
                        self._answer(409, fake.lost_body)
                        return
                    answer = {**ASSIGNMENT, "token": body["token"], "task": self.path.split("/")[3]}
                    self._answer(200, {**answer, "leaseRemainingSeconds": fake.remaining})
                    return
                fake.reports.append((self.path.rsplit("/", 1)[-1], body))
                if fake.cut_reports > 0:
                    fake.cut_reports -= 1
                    self._cut()
                    return
                if fake.unavailable_reports > 0:
                    fake.unavailable_reports -= 1
                    self._answer(503, {"error": "ApiUnavailable", "message": "api server away"})
                    return
                if fake.lost_after is not None and len(fake.beats) >= fake.lost_after:
                    self._answer(409, {"error": "LeaseLost", "message": "reclaimed"})
                    return
                self._answer(200, {"task": "job", "token": 41, "state": "reported"})

        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        with self.lock:
            for sock in self.sockets:  # a sidecar that exits closes its connections too
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


ASSIGNMENT = {
    "task": "job",
    "namespace": "ns",
    "worker": "w",
    "token": 41,
    "attempt": 2,
    "payload": {"q": 1},
    "leaseDurationSeconds": 0.9,
    "heartbeatIntervalSeconds": 0.3,
    "leaseDeadline": "2030-01-01T00:00:00Z",
    "state": "active",
}


@pytest.fixture
def fake() -> Iterator[FakeSidecar]:
    sidecar = FakeSidecar()
    yield sidecar
    sidecar.close()


def test_assignments_are_listed_and_held_with_background_beats(fake: FakeSidecar) -> None:
    client = SidecarClient(fake.url)
    version, items = client.list()
    assert version == 1 and items[0] == Assignment.of(ASSIGNMENT)
    with client.hold(items[0]) as lease:
        lease.progress("one")
        time.sleep(0.5)  # beats every 0.1 s (a third of the interval)
        lease.complete({"ok": True})
    assert len(fake.beats) >= 3
    assert {"token": 41, "progress": "one"} in fake.beats
    assert fake.reports == [("complete", {"token": 41, "result": {"ok": True}})]


def test_a_409_makes_the_next_call_raise_lease_lost(fake: FakeSidecar) -> None:
    fake.lost_after = 3
    client = SidecarClient(fake.url)
    with pytest.raises(LeaseLost), client.hold(Assignment.of(ASSIGNMENT)) as lease:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            lease.progress("working")  # raises once the heartbeat thread saw the 409
            time.sleep(0.05)
    with pytest.raises(LeaseLost):
        client.complete("job", 41)  # and the sidecar says so too


def test_interrupt_raises_lease_lost_inside_pure_python_work(fake: FakeSidecar) -> None:
    fake.lost_after = 2
    client = SidecarClient(fake.url)
    started = time.monotonic()
    with pytest.raises(LeaseLost), client.hold(Assignment.of(ASSIGNMENT), interrupt=True):
        while time.monotonic() - started < 10:  # busy work that never checks
            sum(range(1000))
    assert time.monotonic() - started < 5


def test_an_unreachable_sidecar_past_the_deadline_is_presumed_lost(fake: FakeSidecar) -> None:
    client = SidecarClient(fake.url, timeout=0.5)
    fake.remaining = 0.9
    with client.hold(Assignment.of(ASSIGNMENT)) as lease:
        fake.close()  # the sidecar vanishes (frozen, cut off)
        deadline = time.monotonic() + 10
        with pytest.raises(LeaseLost) as lost:
            while time.monotonic() < deadline:
                lease.check()
                time.sleep(0.05)
        assert lost.value.code == "LeaseDeadlinePassed"
    with pytest.raises(SidecarUnavailable):
        client.list()


def test_a_report_the_sidecar_cannot_take_yet_is_sent_again_while_the_lease_holds(
    fake: FakeSidecar,
) -> None:
    fake.unavailable_reports = 3  # an API server restart: the sidecar answers 503 for a while
    client = SidecarClient(fake.url)
    with client.hold(Assignment.of(ASSIGNMENT)) as lease:
        answer = lease.complete({"ok": True})
        beats = len(fake.beats)
    assert answer["state"] == "reported"
    assert [kind for kind, _ in fake.reports] == ["complete"] * 4
    assert beats >= 3, "the heartbeats went on while the report waited"


def test_an_answer_cut_short_neither_stops_the_heartbeats_nor_drops_the_report(
    fake: FakeSidecar,
) -> None:
    """An answer whose body ends early (the sidecar container restarting mid-answer)
    raises http.client.IncompleteRead, which is neither an OSError nor a URLError: it
    escaped the client. In the heartbeat thread it ended the thread, so the agent went
    on working while nothing beat for it and its lease ran out; from complete() it
    reached the agent instead of the retry a report gets while the sidecar is away."""
    fake.cut_beat = 2
    fake.cut_reports = 1
    client = SidecarClient(fake.url)
    with client.hold(Assignment.of(ASSIGNMENT)) as lease:
        time.sleep(0.6)  # beats every 0.1 s
        beats = len(fake.beats)
        answer = lease.complete({"ok": True})
    assert beats >= 4, "the heartbeats stopped after the answer cut short"
    assert answer["state"] == "reported"
    assert [kind for kind, _ in fake.reports] == ["complete"] * 2


def test_an_attempt_missing_from_one_listing_is_not_handed_out_again(fake: FakeSidecar) -> None:
    """A restarted sidecar lists an attempt only once it has read its task again, so
    for a moment its listing omits attempts the agent is working on (and a listing with
    one of two attempts read ends a long-poll that waits for the first). The client
    forgot every attempt a listing did not show, and handed it out again when it came
    back: the same attempt, same token, worked twice at once by an agent that runs
    attempts in parallel."""
    other = {**ASSIGNMENT, "task": "other", "token": 3}
    fake.listings = [[ASSIGNMENT], [], [ASSIGNMENT], [ASSIGNMENT, other]]
    handed = SidecarClient(fake.url).assignments(poll=0)
    assert next(handed).task == "job"
    assert next(handed).task == "other"


def test_a_listing_the_sidecar_failed_to_answer_is_asked_again(fake: FakeSidecar) -> None:
    """A 500 from the sidecar's listing ended ``assignments()``: the agent stopped taking
    work for good, though asking again is harmless (a listing changes nothing)."""
    fake.failed_listings = 2
    handed = SidecarClient(fake.url).assignments(poll=0)
    assert next(handed).task == "job"
    assert fake.failed_listings == 0


def test_a_revoked_claim_raises_cancelled_and_fences_the_registered_keys(
    fake: FakeSidecar, tmp_path: Any
) -> None:
    fake.lost_after = 2
    fake.lost_body = {"error": "Cancelled", "message": "the task was cancelled", "fenceToken": 42}
    client = SidecarClient(fake.url)
    with SQLiteFencedStore(str(tmp_path / "sink.db")) as sink:
        sink.write("job", 41, {"part": 1})
        with pytest.raises(Cancelled) as revoked, client.hold(Assignment.of(ASSIGNMENT)) as lease:
            lease.fence_on_revoke(sink, "job")
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                lease.check()  # raises once the heartbeat thread heard the 409
                time.sleep(0.05)
        assert isinstance(revoked.value, LeaseLost), "every agent that stops on LeaseLost stops"
        assert revoked.value.code == "Cancelled" and revoked.value.fence_token == 42
        with pytest.raises(StaleTokenError):
            sink.write("job", 41, {"part": 2})  # this attempt's own later write


def test_a_revocation_whose_fence_cannot_reach_the_store_still_refuses_the_late_write(
    fake: FakeSidecar, tmp_path: Any
) -> None:
    """The sink's database is away when the 409 Cancelled arrives: the fence is owed, and
    the attempt's later write -- which would reconnect and land -- is refused."""

    class Away(SQLiteFencedStore):
        away = False

        def transaction(self, key: str, token: int) -> Any:
            if self.away:
                raise OSError("connection lost")
            return super().transaction(key, token)

    fake.lost_after = 2
    fake.lost_body = {"error": "Cancelled", "message": "the task was cancelled", "fenceToken": 42}
    client = SidecarClient(fake.url)
    with Away(str(tmp_path / "sink.db")) as sink:
        sink.write("job", 41, {"part": 1})
        sink.away = True
        with pytest.raises(Cancelled), client.hold(Assignment.of(ASSIGNMENT)) as lease:
            lease.fence_on_revoke(sink, "job")
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                lease.check()
                time.sleep(0.05)
        sink.away = False  # the connection is back
        with pytest.raises(StaleTokenError):
            sink.write("job", 41, {"part": 2})
        record = sink.read("job")
        assert record is not None and record.token == 42 and record.value == {"part": 1}


def test_the_secret_is_read_from_the_token_file_named_by_the_environment(
    fake: FakeSidecar, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file = tmp_path / "sidecar-token"
    token_file.write_text("first-secret\n")
    monkeypatch.setenv("AGENTQ_SIDECAR_TOKEN_FILE", str(token_file))
    fake.secret = "first-secret"
    client = SidecarClient(fake.url)
    assert client.list()[1][0].task == "job"
    assert fake.authorizations == ["Bearer first-secret"]
    # The sidecar restarted: a new secret in the file. The next call sends it.
    token_file.write_text("second-secret\n")
    fake.secret = "second-secret"
    client.heartbeat("job", 41)
    assert fake.authorizations[-1] == "Bearer second-secret"


def test_a_401_for_a_secret_that_changed_meanwhile_is_sent_again_once(
    fake: FakeSidecar, tmp_path: Path
) -> None:
    token_file = tmp_path / "sidecar-token"
    token_file.write_text("old")
    client = SidecarClient(fake.url, token_file=token_file)
    fake.secret = "new"
    real = client._send

    def send_then_restart(*args: Any) -> dict[str, Any]:
        token_file.write_text("new")  # the sidecar restarted after the file was read
        return real(*args)

    client._send = send_then_restart  # type: ignore[method-assign]
    assert client.list()[0] == 1
    assert fake.authorizations == ["Bearer old", "Bearer new"]


def test_without_the_secret_the_401_is_raised_at_once_not_waited_out(
    fake: FakeSidecar, tmp_path: Path
) -> None:
    fake.secret = "the-pods"
    client = SidecarClient(fake.url, token_file=tmp_path / "missing")
    with pytest.raises(AgentError) as refused:
        next(client.assignments(poll=0))
    assert (refused.value.status, refused.value.code) == (401, "Unauthorized")
    assert fake.authorizations == [None]
    wrong = SidecarClient(fake.url, token="guess")
    with pytest.raises(AgentError):
        wrong.heartbeat("job", 41)
    assert fake.authorizations[-1] == "Bearer guess"


@pytest.fixture
def keep_alive() -> Iterator[FakeSidecar]:
    sidecar = FakeSidecar(keep_alive=True)
    yield sidecar
    sidecar.close()


def test_calls_share_one_kept_alive_connection(keep_alive: FakeSidecar) -> None:
    """A connection per call (urllib) cost the sidecar an accept and a close each time:
    the larger part of its CPU per task. One connection carries them all."""
    with SidecarClient(keep_alive.url) as client:
        client.list()
        for _ in range(5):
            client.heartbeat("job", 41)
        client.complete("job", 41, {"ok": True})
    assert len(keep_alive.beats) == 5 and len(keep_alive.reports) == 1
    assert keep_alive.connections == 1


def test_a_connection_the_sidecar_closed_while_idle_is_opened_again(
    keep_alive: FakeSidecar, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sidecar closes idle connections (its idle timeout, a restart). Seen before the
    request is sent, or -- when the close crosses the request -- as a reset or an end of
    file before any answer: either way the call goes through on a new connection."""
    keep_alive.drop_idle = True
    client = SidecarClient(keep_alive.url)
    for _ in range(3):
        assert client.heartbeat("job", 41)["token"] == 41
        time.sleep(0.05)  # the close reaches the client
    assert keep_alive.connections == 3
    # The close not seen yet when the connection is taken: the request itself fails.
    monkeypatch.setattr("agentq.agent._dropped", lambda conn: False)
    for _ in range(3):
        assert client.heartbeat("job", 41)["token"] == 41
        time.sleep(0.05)
    assert len(keep_alive.beats) == 6
    assert keep_alive.connections == 6


def test_a_sidecar_that_went_away_is_unavailable_not_retried_for_ever(
    keep_alive: FakeSidecar,
) -> None:
    client = SidecarClient(keep_alive.url, timeout=1.0)
    client.heartbeat("job", 41)
    keep_alive.close()
    with pytest.raises(SidecarUnavailable):
        client.heartbeat("job", 41)


def test_threads_sharing_a_client_each_get_their_own_answer(keep_alive: FakeSidecar) -> None:
    """agent-sim calls one client from its listing thread, each attempt's thread and each
    heartbeat thread at once: a connection is used by one thread at a time."""
    client = SidecarClient(keep_alive.url)
    wrong: list[tuple[int, Any]] = []

    def beat(token: int) -> None:
        for _ in range(20):
            answer = client.heartbeat(f"task-{token}", token)
            if (answer["token"], answer["task"]) != (token, f"task-{token}"):
                wrong.append((token, answer))

    threads = [threading.Thread(target=beat, args=(token,)) for token in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []
    assert len(keep_alive.beats) == 160
    assert keep_alive.connections <= 8


def test_assignments_long_polls_for_offers_only(fake: FakeSidecar) -> None:
    """The agent's listing loop asked to be woken at any change of the listing: each of
    its own reports (and the end that follows it) woke it for a listing with nothing
    new, a wake-up and a listing encoded for nothing."""
    other = {**ASSIGNMENT, "task": "other", "token": 3}
    fake.listings = [[ASSIGNMENT], [ASSIGNMENT, other]]
    handed = SidecarClient(fake.url).assignments(poll=5)
    assert [next(handed).task, next(handed).task] == ["job", "other"]
    assert fake.paths == [
        "/v1/assignments?wait=5",
        "/v1/assignments?wait=5&after=2&until=offers",
    ]


def test_a_sidecar_that_predates_offers_only_gets_plain_long_polls(fake: FakeSidecar) -> None:
    """The SDK and the sidecar come in different images: an agent upgraded first must not
    stop taking work because its sidecar refuses the new parameter."""
    fake.refuse_until = True
    other = {**ASSIGNMENT, "task": "other", "token": 3}
    fake.listings = [[ASSIGNMENT], [ASSIGNMENT, other]]
    handed = SidecarClient(fake.url).assignments(poll=5)
    assert [next(handed).task, next(handed).task] == ["job", "other"]
    assert fake.paths == [
        "/v1/assignments?wait=5",
        "/v1/assignments?wait=5&after=2&until=offers",
        "/v1/assignments?wait=5&after=2",
    ]


# -- budgets: usage and throttles ------------------------------------------------------------

BUDGETED = {
    **ASSIGNMENT,
    "budgets": [
        {"name": "openai", "requests": 1, "tokens": 1000},
        {"name": "search", "requests": 1, "tokens": 0},
    ],
}


def test_record_usage_sends_the_running_total_with_the_beats_and_the_report(
    fake: FakeSidecar,
) -> None:
    client = SidecarClient(fake.url)
    assignment = Assignment.of(BUDGETED)
    assert assignment.budgets == ("openai", "search")
    with client.hold(assignment, beat_seconds=0.05) as lease:
        lease.record_usage("openai", tokens=300)
        assert lease.record_usage("openai", requests=2, tokens=200) == {
            "openai": {"requests": 3, "tokens": 500}
        }
        time.sleep(0.3)
        lease.record_usage("search")
        lease.complete({"ok": True})
    sent = [beat["usage"] for beat in fake.beats if "usage" in beat]
    # Cumulative, and sent only when it changed (not with every beat).
    assert {"openai": {"requests": 3, "tokens": 500}} in sent
    assert all(a != b for a, b in itertools.pairwise(sent))
    assert fake.reports == [
        (
            "complete",
            {
                "token": 41,
                "result": {"ok": True},
                "usage": {
                    "openai": {"requests": 3, "tokens": 500},
                    "search": {"requests": 1, "tokens": 0},
                },
            },
        )
    ]


def test_bad_usage_is_refused_by_the_sdk_before_it_is_sent(fake: FakeSidecar) -> None:
    client = SidecarClient(fake.url)
    with client.hold(Assignment.of(BUDGETED)) as lease:
        for budget, requests, tokens in (
            ("anthropic", 1, 0),  # not named by the task
            ("openai", -1, 0),
            ("openai", 1, 1.5),
            ("openai", True, 0),
            ("openai", 0, 10**12 + 1),
        ):
            with pytest.raises(ValueError):
                lease.record_usage(budget, requests=requests, tokens=tokens)  # type: ignore[arg-type]
        assert lease.usage() == {}
        with pytest.raises(ValueError):
            lease.throttled("openai", 0)
        with pytest.raises(ValueError):
            lease.throttled("anthropic", 5)
        lease.fail("Boom")
    assert fake.reports == [
        ("fail", {"token": 41, "reason": "Boom", "message": "", "retryable": True})
    ]


def test_throttled_is_sent_at_once_with_the_usage_so_far(fake: FakeSidecar) -> None:
    client = SidecarClient(fake.url)
    with client.hold(Assignment.of(BUDGETED), beat_seconds=60) as lease:
        lease.record_usage("openai", tokens=10)
        lease.throttled("openai", 20)
        lease.throttled("openai", 86400)  # a day's quota: asked as the longest pause
        lease.complete()
    throttles = [beat for beat in fake.beats if "throttled" in beat]
    assert throttles == [
        {
            "token": 41,
            "usage": {"openai": {"requests": 1, "tokens": 10}},
            "throttled": {"budget": "openai", "retryAfterSeconds": 20},
        },
        {
            "token": 41,
            "usage": {"openai": {"requests": 1, "tokens": 10}},
            "throttled": {"budget": "openai", "retryAfterSeconds": 3600},
        },
    ]


def test_usage_the_sidecar_refuses_does_not_cost_the_lease(fake: FakeSidecar) -> None:
    fake.refuse_usage = True
    client = SidecarClient(fake.url)
    assignment = Assignment.of({**ASSIGNMENT, "leaseDurationSeconds": 0.6})  # no budgets said
    assert assignment.budgets is None
    with client.hold(assignment, beat_seconds=0.05) as lease:
        lease.record_usage("openai", tokens=10)
        time.sleep(1.0)  # past the lease duration: beats kept it
        lease.check()
    assert lease.usage_error is not None and lease.usage_error.code == "InvalidUsage"
    with_usage = [beat for beat in fake.beats if "usage" in beat]
    assert len(with_usage) == 1  # not sent again unchanged
    assert len(fake.beats) > 5
