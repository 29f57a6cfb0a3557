"""Bad-input corpus: hostile requests to the sidecar's agent API (docs/agent-api.md).

A real ``agentq sidecar`` process serves worker ``sc`` on loopback; the test is the
agent, well-behaved or not: malformed JSON, unknown tasks, forged or mistyped
tokens, bodies over the limits, wrong methods and content types, over-long fields,
deep JSON, broken HTTP, slow and idle connections, calls without the pod's secret
or with a wrong one, a DNS-rebinding Host. Each request must get a clear
4xx answer (JSON ``{"error", "message"}``) and change nothing; after each case the
sidecar must still serve (``/healthz``) and a good task must go through it end to
end (assignment, heartbeat, complete, Succeeded on the API server).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentq.controlplane.cluster import free_port
from builders import task, worker
from corpus import Arena, Case, cases_as_params, deep_text
from fleet import ControlPlane, Process

# The corpus is slow (make test, not make test-fast).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

LEASE = 5


class Sidecar:
    """A sidecar process for worker ``sc``, started on first use."""

    def __init__(self, arena: Arena, workdir: Path) -> None:
        self.arena = arena
        self.workdir = workdir
        self.port = free_port()
        self.token_file = workdir / "sidecar-token"
        self.proc: Process | None = None
        arena.fleet.add_worker(worker("sc").capabilities("sc").max_in_flight(2))

    def ensure(self) -> None:
        if self.proc is not None and self.proc.popen.poll() is None:
            return
        args = [
            sys.executable,
            "-m",
            "agentq.cli",
            "sidecar",
            "--worker",
            "sc",
            "--namespace",
            self.arena.namespace,
            "--listen",
            f"127.0.0.1:{self.port}",
            "--kubeconfig",
            self.arena.fleet.kubeconfig,
            "--worker-lease-seconds",
            "4",
            "--token-file",
            str(self.token_file),
            "--metrics-listen",
            "127.0.0.1:0",
        ]
        self.proc = Process(
            args, self.workdir / f"sidecar-{time.time():.0f}.log", self.arena.fleet._env()
        )
        self.arena.fleet.processes.append(self.proc)
        deadline = time.monotonic() + 30
        while '"serving"' not in self.proc.text():
            if self.proc.popen.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the sidecar did not start:\n{self.proc.text()[-2000:]}")
            time.sleep(0.2)

    # -- HTTP ------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        content_type: str | None = "application/json",
        headers: dict[str, str] | None = None,
        secret: str | None = "",
        timeout: float = 20,
    ) -> tuple[int, Any]:
        """One request, with the pod's secret unless ``secret`` is another (None: none)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            hdrs = dict(headers or {})
            if secret == "":
                secret = self.secret()
            if secret is not None:
                hdrs["Authorization"] = f"Bearer {secret}"
            if content_type and body is not None:
                hdrs["Content-Type"] = content_type
            conn.request(method, path, body=body, headers=hdrs)
            response = conn.getresponse()
            data = response.read()
        finally:
            conn.close()
        try:
            return response.status, json.loads(data)
        except ValueError:
            return response.status, data.decode(errors="replace")

    def secret(self) -> str:
        return self.token_file.read_text().strip()

    def post(self, task_name: str, verb: str, body: Any, **kw: Any) -> tuple[int, Any]:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.request("POST", f"/v1/assignments/{task_name}/{verb}", raw, **kw)

    # -- a well-behaved agent ----------------------------------------------------------

    def assignment(self, task_name: str, *, timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            status, body = self.request("GET", "/v1/assignments?wait=1")
            if status == 200:
                for item in body.get("assignments", []):
                    if item.get("task") == task_name:
                        return dict(item)
            if time.monotonic() > deadline:
                raise AssertionError(f"{task_name} never assigned through the sidecar: {body}")
            time.sleep(0.2)

    def running(self, prefix: str) -> tuple[str, int]:
        """A task of ``sc``, assigned and started through the sidecar."""
        name = self.arena.name(prefix)
        self.arena.create_task(task(name).requires("sc").lease(LEASE))
        token = int(self.assignment(name)["token"])
        status, body = self.post(name, "heartbeat", {"token": token, "progress": "start"})
        assert status == 200, body
        self.arena.fleet.wait_phase(name, "Running", timeout=20)
        return name, token

    def complete(self, name: str, token: int) -> None:
        status, body = self.post(name, "heartbeat", {"token": token})
        assert status == 200, body
        status, body = self.post(name, "complete", {"token": token, "result": {"by": "sc"}})
        assert status == 200, body
        done = self.arena.fleet.wait_phase(name, "Succeeded", timeout=20)["status"]
        assert done["result"] == {"by": "sc"} and done["fencingToken"] == token

    def assert_serving(self) -> None:
        assert self.proc is not None and self.proc.popen.poll() is None, (
            self.proc and self.proc.text()[-2000:]
        )
        status, body = self.request("GET", "/healthz")
        assert status == 200, body
        name, token = self.running("good")
        self.complete(name, token)


@pytest.fixture(scope="module")
def sidecar(
    control_plane: ControlPlane, agentq_crds: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Sidecar]:
    workdir = tmp_path_factory.mktemp("bad-sidecar")
    arena = Arena(control_plane, workdir, puppets=())
    try:
        yield Sidecar(arena, workdir)
    finally:
        arena.close()


def clear_refusal(status: int, body: Any, expected: tuple[int, ...]) -> None:
    assert status in expected, (status, body)
    assert isinstance(body, dict) and body.get("error") and body.get("message"), body


# --- cases: bodies ----------------------------------------------------------------------


def refused_body(verb: str, body: Any, expected: tuple[int, ...] = (400,), **kw: Any) -> Any:
    """Send ``body`` for a live assignment: a clear refusal, and the attempt unchanged."""

    def run(sc: Sidecar) -> None:
        name, token = sc.running(f"bad-{verb}")
        value = body(token) if callable(body) else body
        status, answer = sc.post(name, verb, value, **kw)
        clear_refusal(status, answer, expected)
        state = sc.arena.status(name)
        assert state["phase"] == "Running" and state["fencingToken"] == token, state
        assert "result" not in state
        sc.complete(name, token)

    return run


BODY_CASES = [
    Case("heartbeat-malformed-json", refused_body("heartbeat", b'{"token":')),
    Case("complete-body-a-list", refused_body("complete", b"[]")),
    Case("complete-empty-body", refused_body("complete", b"")),
    Case("complete-json-null", refused_body("complete", b"null")),
    Case("heartbeat-token-a-string", refused_body("heartbeat", lambda t: {"token": str(t)})),
    Case("heartbeat-token-true", refused_body("heartbeat", {"token": True})),
    Case("complete-token-a-float", refused_body("complete", lambda t: {"token": t + 0.5})),
    Case("complete-token-negative", refused_body("complete", {"token": -1})),
    Case("complete-token-beyond-int64", refused_body("complete", {"token": 2**64})),
    Case("complete-token-missing", refused_body("complete", {"result": 1})),
    Case(
        "complete-nan",
        refused_body("complete", lambda t: f'{{"token": {t}, "result": NaN}}'.encode()),
    ),
    Case(
        "complete-deep-json",
        refused_body(
            "complete", lambda t: f'{{"token": {t}, "result": {deep_text(3000)}}}'.encode()
        ),
    ),
    Case(
        "complete-invalid-utf8",
        refused_body("complete", lambda t: f'{{"token": {t}, "result": "'.encode() + b'\xff\xfe"}'),
    ),
    Case(
        "complete-unknown-field", refused_body("complete", lambda t: {"token": t, "colour": "red"})
    ),
    Case(
        "fail-reason-2000-chars",
        refused_body("fail", lambda t: {"token": t, "reason": "r" * 2000}, (413, 422)),
    ),
    Case(
        "fail-message-40000-chars",
        refused_body(
            "fail", lambda t: {"token": t, "reason": "R", "message": "m" * 40000}, (413, 422)
        ),
    ),
    Case(
        "complete-result-ref-5000-chars",
        refused_body(
            "complete", lambda t: {"token": t, "resultRef": "s3://" + "k" * 5000}, (413, 422)
        ),
    ),
    Case(
        "heartbeat-progress-2000-chars",
        refused_body("heartbeat", lambda t: {"token": t, "progress": "p" * 2000}, (413, 422)),
    ),
    Case(
        "complete-result-over-64KiB",
        refused_body("complete", lambda t: {"token": t, "result": "x" * 70_000}, (413, 422)),
    ),
    Case("fail-without-reason", refused_body("fail", lambda t: {"token": t})),
    Case(
        "fail-retryable-a-string",
        refused_body("fail", lambda t: {"token": t, "reason": "X", "retryable": "no"}),
    ),
    Case(
        "body-over-1MB",
        refused_body(
            "complete",
            lambda t: f'{{"token": {t}, "result": "{"x" * 1_200_000}"}}'.encode(),
            (413,),
        ),
    ),
    Case(
        "form-encoded-body",
        refused_body(
            "complete",
            lambda t: f"token={t}".encode(),
            (415,),
            content_type="application/x-www-form-urlencoded",
        ),
    ),
    Case(
        "complete-as-text-plain",
        refused_body(
            "complete",
            lambda t: {"token": t, "result": "as text"},
            (415,),
            content_type="text/plain",
        ),
    ),
]


# --- cases: who and where ---------------------------------------------------------------


def forged_token(sc: Sidecar) -> None:
    name, token = sc.running("forged")
    status, body = sc.post(name, "complete", {"token": token + 1, "result": "forged"})
    clear_refusal(status, body, (409,))
    assert sc.arena.status(name).get("result") != "forged"
    sc.complete(name, token)


def unknown_task(sc: Sidecar) -> None:
    status, body = sc.post("never-assigned", "heartbeat", {"token": 1})
    clear_refusal(status, body, (404, 409))


def zombie_heartbeat(sc: Sidecar) -> None:
    name, token = sc.running("zombie")
    sc.complete(name, token)
    # Until the sidecar sees the attempt's Lease deleted (the operator does it right after
    # committing, the watch tells the sidecar a moment later) a beat is answered with the
    # attempt in state "reported" (docs/agent-api.md) and renews nothing; then refused.
    deadline = time.monotonic() + 20
    while True:
        status, body = sc.post(name, "heartbeat", {"token": token})
        if status != 200 or time.monotonic() > deadline:
            break
        assert body.get("state") == "reported", body
        time.sleep(0.2)
    clear_refusal(status, body, (404, 409))
    assert sc.arena.status(name)["phase"] == "Succeeded"


def completed_twice(sc: Sidecar) -> None:
    name, token = sc.running("twice")
    sc.complete(name, token)
    status, body = sc.post(name, "complete", {"token": token, "result": {"by": "sc"}})
    assert status in (200, 404, 409), (status, body)  # idempotent, or a clear refusal
    history = sc.arena.status(name).get("history") or []
    assert sum(1 for h in history if h["outcome"] == "Succeeded") == 1


def not_the_pods_secret(sc: Sidecar) -> None:
    """Without the secret, with a wrong or an old one, another scheme, or through a
    rebinding name: refused, and a complete sent that way writes nothing."""
    name, token = sc.running("intruder")
    secret = sc.secret()
    for how, kw, expected in (
        ("none", {"secret": None}, 401),
        ("wrong", {"secret": "x" * len(secret)}, 401),
        ("a prefix", {"secret": secret[:-1]}, 401),
        ("with a suffix", {"secret": secret + "x"}, 401),
        ("empty", {"secret": None, "headers": {"Authorization": "Bearer "}}, 401),
        ("basic", {"secret": None, "headers": {"Authorization": f"Basic {secret}"}}, 401),
        ("rebinding", {"headers": {"Host": f"attacker.example:{sc.port}"}}, 403),
    ):
        status, body = sc.post(name, "complete", {"token": token, "result": "forged"}, **kw)
        clear_refusal(status, body, (expected,))
        assert how and body["error"] in ("Unauthorized", "HostNotAllowed"), (how, body)
    state = sc.arena.status(name)
    assert state["phase"] == "Running" and "result" not in state, state
    sc.complete(name, token)


def path_case(method: str, path: str, expected: tuple[int, ...]) -> Any:
    def run(sc: Sidecar) -> None:
        status, body = sc.request(method, path, b"{}" if method in ("POST", "PUT") else None)
        clear_refusal(status, body, expected)

    return run


PATH_CASES = [
    Case("forged-token", forged_token),
    Case("not-the-pods-secret", not_the_pods_secret),
    Case("unknown-task", unknown_task),
    Case("heartbeat-after-the-attempt-ended", zombie_heartbeat),
    Case("complete-twice", completed_twice),
    Case("get-on-complete", path_case("GET", "/v1/assignments/x/complete", (405,))),
    Case("put-on-assignments", path_case("PUT", "/v1/assignments", (405,))),
    Case("delete-an-assignment", path_case("DELETE", "/v1/assignments/x", (405,))),
    Case("unknown-endpoint", path_case("GET", "/v2/everything", (404,))),
    Case(
        "task-name-path-traversal",
        path_case("POST", "/v1/assignments/..%2F..%2Fetc/complete", (400, 404)),
    ),
    Case("task-name-uppercase", path_case("POST", "/v1/assignments/Task/heartbeat", (400, 404))),
    Case("wait-not-a-number", path_case("GET", "/v1/assignments?wait=abc", (400,))),
    Case("wait-a-billion-seconds", path_case("GET", "/v1/assignments?wait=1e9", (400,))),
    Case("unknown-query-parameter", path_case("GET", "/v1/assignments?colour=red", (400,))),
]


# --- cases: broken HTTP -----------------------------------------------------------------


def raw_exchange(port: int, data: bytes, *, timeout: float = 10) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        with contextlib.suppress(TimeoutError, ConnectionResetError):
            while chunk := sock.recv(65536):
                chunks.append(chunk)
    return b"".join(chunks)


def garbage_request_line(sc: Sidecar) -> None:
    answer = raw_exchange(sc.port, b"HELLO THERE\r\n\r\n")
    assert answer.startswith(b"HTTP/1.") and b" 400 " in answer.split(b"\r\n")[0], answer[:200]


def very_long_path(sc: Sidecar) -> None:
    answer = raw_exchange(
        sc.port, b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    )
    status = answer.split(b"\r\n")[0]
    assert answer.startswith(b"HTTP/1.") and (
        b" 400 " in status or b" 414 " in status or b" 404 " in status
    ), status


def lying_content_length(sc: Sidecar) -> None:
    # Announces 1,000 bytes, sends 10, then waits: the sidecar must not wedge on it.
    with socket.create_connection(("127.0.0.1", sc.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/assignments/x/complete HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"token":'
        )
        started = time.monotonic()
        status, _ = sc.request("GET", "/healthz", timeout=5)
        assert status == 200 and time.monotonic() - started < 3


def slowloris(sc: Sidecar) -> None:
    socks = []
    try:
        for _ in range(50):
            s = socket.create_connection(("127.0.0.1", sc.port), timeout=10)
            s.sendall(b"GET /v1/assignments HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            socks.append(s)
        for _ in range(3):
            for s in socks:
                with contextlib.suppress(OSError):
                    s.sendall(b"a")
            started = time.monotonic()
            status, _ = sc.request("GET", "/healthz", timeout=5)
            assert status == 200 and time.monotonic() - started < 3
            time.sleep(0.5)
    finally:
        for s in socks:
            s.close()


def idle_connections(sc: Sidecar) -> None:
    socks = [socket.create_connection(("127.0.0.1", sc.port), timeout=10) for _ in range(200)]
    try:
        started = time.monotonic()
        status, _ = sc.request("GET", "/healthz", timeout=5)
        assert status == 200 and time.monotonic() - started < 3
    finally:
        for s in socks:
            s.close()


HTTP_CASES = [
    Case("garbage-request-line", garbage_request_line),
    Case("path-of-100KB", very_long_path),
    Case("content-length-that-lies", lying_content_length),
    Case("slowloris-50-connections", slowloris),
    Case("200-idle-connections", idle_connections),
]

CASES = BODY_CASES + PATH_CASES + HTTP_CASES


@pytest.mark.timeout(180)
@pytest.mark.parametrize("case", cases_as_params(CASES))
def test_a_hostile_agent_request_gets_a_clear_answer_and_changes_nothing(
    sidecar: Sidecar, case: Case
) -> None:
    sidecar.arena.begin_case()
    try:
        sidecar.ensure()
        case.run(sidecar)
    finally:
        sidecar.arena.end_case()
    sidecar.assert_serving()
