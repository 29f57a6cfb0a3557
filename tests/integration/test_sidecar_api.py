"""The sidecar's agent API under hostile input, and against its OpenAPI description.

One sidecar (a real process) holds one real claim granted by the operator; every
bad request must get a clear 4xx JSON answer, change nothing (the claim's Lease
is not written, the attempt stays live) and leave the sidecar serving. Then
schemathesis sends what the OpenAPI file allows and what it does not.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.core.parameters import ParameterLocation
from schemathesis.generation import GenerationMode

from agentq import protocol
from builders import task, worker
from fleet import AgentPair, ControlPlane, Fleet

OPENAPI = Path(__file__).resolve().parents[2] / "docs" / "agent-api.openapi.yaml"


class Held:
    """A sidecar holding one live claim (its agent beats), the task and its token."""

    def __init__(self, fleet: Fleet, pair: AgentPair, token: int) -> None:
        self.fleet = fleet
        self.pair = pair
        self.url = pair.url
        self.token = token

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.pair.secret()}"}


@pytest.fixture(scope="module")
def held(
    control_plane: ControlPlane, agentq_crds: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Held]:
    namespace = f"api-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", namespace)
    fleet = Fleet(
        kubeconfig=control_plane.kubeconfig,
        namespace=namespace,
        workdir=tmp_path_factory.mktemp("sidecar-api"),
        kubectl=control_plane.kubectl_path,
    )
    try:
        fleet.add_worker(worker("w").capabilities("llm").max_in_flight(2))
        pair = fleet.agent("w", "hold")
        fleet.operator()
        fleet.add_task(task("job").requires("llm").lease(30))
        status = fleet.wait_phase("job", "Running", timeout=60)["status"]
        yield Held(fleet, pair, int(status["fencingToken"]))
    finally:
        fleet.close()
        control_plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def call(
    url: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        raw = err.read()
        assert err.headers.get("Content-Type", "").startswith("application/json"), raw[:200]
        return err.code, json.loads(raw)


BEAT = "/v1/assignments/job/heartbeat"
DONE = "/v1/assignments/job/complete"
FAIL = "/v1/assignments/job/fail"


def bad_requests(token: int) -> list[tuple[str, str, str, bytes, int, str]]:
    """(id, method, path, body, expected status, expected error code)."""
    big = json.dumps({"token": token, "result": "x" * (1 << 20)}).encode()
    deep = ("[" * 100_000 + "]" * 100_000).encode()
    just_over = json.dumps({"token": token, "result": "y" * (protocol.MAX_REPORT_BYTES)}).encode()
    return [
        ("not-json", "POST", BEAT, b"{token: 1", 400, "BadRequest"),
        ("empty-body", "POST", BEAT, b"", 400, "BadRequest"),
        ("not-an-object", "POST", BEAT, b"[1, 2]", 400, "BadRequest"),
        ("not-utf8", "POST", BEAT, b'{"token": "\xff"}', 400, "BadRequest"),
        ("nan", "POST", DONE, f'{{"token": {token}, "result": NaN}}'.encode(), 400, "BadRequest"),
        ("deep-nesting", "POST", DONE, deep, 400, "BadRequest"),
        ("token-missing", "POST", BEAT, b"{}", 400, "BadRequest"),
        ("token-string", "POST", BEAT, f'{{"token": "{token}"}}'.encode(), 400, "BadRequest"),
        ("token-bool", "POST", BEAT, b'{"token": true}', 400, "BadRequest"),
        ("token-float", "POST", BEAT, f'{{"token": {token}.0}}'.encode(), 400, "BadRequest"),
        ("token-zero", "POST", BEAT, b'{"token": 0}', 400, "BadRequest"),
        ("token-huge", "POST", BEAT, b'{"token": 99999999999999999999999}', 400, "BadRequest"),
        (
            "unknown-field",
            "POST",
            DONE,
            f'{{"token": {token}, "outcome": "x"}}'.encode(),
            400,
            "BadRequest",
        ),
        (
            "progress-too-long",
            "POST",
            BEAT,
            json.dumps({"token": token, "progress": "p" * 2000}).encode(),
            422,
            "Unprocessable",
        ),
        (
            "progress-multibyte-over",
            "POST",
            BEAT,
            json.dumps({"token": token, "progress": "é" * 600}).encode(),
            422,
            "Unprocessable",
        ),
        ("reason-missing", "POST", FAIL, f'{{"token": {token}}}'.encode(), 400, "BadRequest"),
        (
            "reason-blank",
            "POST",
            FAIL,
            f'{{"token": {token}, "reason": "  "}}'.encode(),
            400,
            "BadRequest",
        ),
        (
            "reason-too-long",
            "POST",
            FAIL,
            json.dumps({"token": token, "reason": "r" * 1025}).encode(),
            422,
            "Unprocessable",
        ),
        (
            "message-too-long",
            "POST",
            FAIL,
            json.dumps({"token": token, "reason": "r", "message": "m" * 32769}).encode(),
            422,
            "Unprocessable",
        ),
        (
            "retryable-string",
            "POST",
            FAIL,
            json.dumps({"token": token, "reason": "r", "retryable": "no"}).encode(),
            400,
            "BadRequest",
        ),
        (
            "result-ref-too-long",
            "POST",
            DONE,
            json.dumps({"token": token, "resultRef": "s" * 4097}).encode(),
            422,
            "Unprocessable",
        ),
        ("report-over-64k", "POST", DONE, just_over, 413, "PayloadTooLarge"),
        ("body-over-limit", "POST", DONE, big, 413, "PayloadTooLarge"),
        (
            "forged-token",
            "POST",
            DONE,
            json.dumps({"token": token + 1000}).encode(),
            409,
            "StaleToken",
        ),
        (
            "unknown-task",
            "POST",
            "/v1/assignments/nope/complete",
            json.dumps({"token": token}).encode(),
            404,
            "UnknownTask",
        ),
        (
            "bad-task-name",
            "POST",
            "/v1/assignments/NOT_A_NAME/heartbeat",
            json.dumps({"token": token}).encode(),
            400,
            "BadRequest",
        ),
        ("unknown-endpoint", "GET", "/v1/nothing", b"", 404, "NotFound"),
        ("wrong-method", "DELETE", "/v1/assignments/job", b"", 405, "MethodNotAllowed"),
        ("bad-wait", "GET", "/v1/assignments?wait=forever", b"", 400, "BadRequest"),
        ("wait-too-long", "GET", "/v1/assignments?wait=3600", b"", 400, "BadRequest"),
        ("bad-after", "GET", "/v1/assignments?after=-1", b"", 400, "BadRequest"),
        ("unknown-query", "GET", "/v1/assignments?token=1", b"", 400, "BadRequest"),
        ("repeated-query", "GET", "/v1/assignments?wait=0&wait=true", b"", 400, "BadRequest"),
    ]


def test_bad_requests_get_a_clear_4xx_change_nothing_and_the_sidecar_stays_up(held: Held) -> None:
    lease_before = held.fleet.task_lease("job")
    assert lease_before is not None
    reports_before = (lease_before.metadata.annotations or {}).get(protocol.ANNOTATION_REPORT)
    assert reports_before is None
    for case_id, method, path, body, status, code in bad_requests(held.token):
        got_status, got = call(
            held.url,
            method,
            path,
            body or None,
            {"Content-Type": "application/json", **held.auth()},
        )
        assert (got_status, got.get("error")) == (status, code), (case_id, got_status, got)
        assert isinstance(got.get("message"), str) and got["message"], (case_id, got)
    # Nothing changed: the claim is live, unreported, still held with the same token.
    status, assignment = call(held.url, "GET", "/v1/assignments/job", headers=held.auth())
    assert status == 200 and assignment["token"] == held.token
    assert assignment["state"] == "active"
    lease = held.fleet.task_lease("job")
    assert lease is not None
    assert protocol.ANNOTATION_REPORT not in (lease.metadata.annotations or {})
    assert protocol.lease_token(lease.metadata.annotations) == held.token
    assert held.fleet.task("job")["status"]["phase"] == "Running"
    assert call(held.url, "GET", "/healthz", headers=held.auth())[0] == 200
    assert held.pair.sidecar.popen.poll() is None
    # And it still renews: the agent keeps beating, the Lease keeps changing.
    renew_before = lease.spec.renew_time
    deadline = time.monotonic() + 25
    while held.fleet.task_lease("job").spec.renew_time == renew_before:  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the sidecar stopped renewing"
        time.sleep(0.5)


def test_a_valid_token_still_gets_through(held: Held) -> None:
    status, body = call(
        held.url,
        "POST",
        BEAT,
        json.dumps({"token": held.token, "progress": "from the test"}).encode(),
        {"Content-Type": "application/json", **held.auth()},
    )
    assert status == 200 and body["token"] == held.token and body["progress"] == "from the test"
    assert body["leaseRemainingSeconds"] > 0


# A static file: loaded at import; the sidecar's address comes from the fixture per call.
schema = schemathesis.openapi.from_path(OPENAPI)


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_api_matches_its_openapi_description(case: Any, held: Held) -> None:
    query = case.query or {}
    try:  # long polls answer at their timeout; keep the run short
        if 0 < float(query.get("wait")) <= 60:
            query["wait"] = 0.1
    except (TypeError, ValueError):
        pass
    # A case whose headers were made to break the schema (the Authorization header
    # left out) is sent without our credential: adding it back turned such a case into a
    # valid, accepted one, which schemathesis reports as accepted negative data.
    headers = case.meta.components.get(ParameterLocation.HEADER) if case.meta else None
    negative = headers is not None and headers.mode == GenerationMode.NEGATIVE
    auth = {} if negative else held.auth()
    case.call_and_validate(base_url=held.url, timeout=30, headers=auth)
    assert held.pair.sidecar.popen.poll() is None


# -- who may call -------------------------------------------------------------------------


def guard_cases(held: Held) -> list[tuple[str, str, str, bytes | None, dict[str, str], int, str]]:
    """(id, method, path, body, headers, expected status, expected error code)."""
    secret = held.pair.secret()
    beat = json.dumps({"token": held.token}).encode()
    good = {"Authorization": f"Bearer {secret}"}
    json_type = {"Content-Type": "application/json"}
    return [
        ("no-credential", "GET", "/v1/assignments", None, {}, 401, "Unauthorized"),
        ("no-credential-beat", "POST", BEAT, beat, json_type, 401, "Unauthorized"),
        ("no-credential-status", "GET", "/v1/status", None, {}, 401, "Unauthorized"),
        ("no-credential-health", "GET", "/healthz", None, {}, 401, "Unauthorized"),
        ("no-credential-unknown-path", "GET", "/v1/nothing", None, {}, 401, "Unauthorized"),
        (
            "wrong-secret",
            "GET",
            "/v1/assignments",
            None,
            {"Authorization": f"Bearer {secret[:-1]}x"},
            401,
            "Unauthorized",
        ),
        (
            "wrong-secret-complete",
            "POST",
            DONE,
            beat,
            {"Authorization": "Bearer guess", **json_type},
            401,
            "Unauthorized",
        ),
        (
            "basic-scheme",
            "GET",
            "/v1/assignments",
            None,
            {"Authorization": f"Basic {secret}"},
            401,
            "Unauthorized",
        ),
        (
            "rebinding-host",
            "GET",
            "/v1/assignments",
            None,
            {"Host": "evil.example:8700", **good},
            403,
            "HostNotAllowed",
        ),
        ("form-post", "POST", BEAT, b"token=1", good, 415, "UnsupportedMediaType"),
        (
            "text-post",
            "POST",
            DONE,
            beat,
            {"Content-Type": "text/plain", **good},
            415,
            "UnsupportedMediaType",
        ),
    ]


def test_a_call_without_the_pods_secret_or_from_a_browser_is_refused(held: Held) -> None:
    lease_before = held.fleet.task_lease("job")
    assert lease_before is not None
    for case_id, method, path, body, headers, status, code in guard_cases(held):
        got_status, got = call(held.url, method, path, body, headers)
        assert (got_status, got.get("error")) == (status, code), (case_id, got_status, got)
        assert isinstance(got.get("message"), str) and got["message"], (case_id, got)
    # A refused complete wrote nothing: the claim is live and unreported.
    lease = held.fleet.task_lease("job")
    assert lease is not None
    assert protocol.ANNOTATION_REPORT not in (lease.metadata.annotations or {})
    assert held.fleet.task("job")["status"]["phase"] == "Running"
    # Loopback names, an IP literal and JSON with a charset all pass.
    for host in ("localhost:1", "127.0.0.1", "[::1]:8700", "LOCALHOST."):
        got_status, _ = call(held.url, "GET", "/v1/status", None, {"Host": host, **held.auth()})
        assert got_status == 200, host
    got_status, _ = call(
        held.url,
        "POST",
        BEAT,
        json.dumps({"token": held.token}).encode(),
        {"Content-Type": "application/json; charset=utf-8", **held.auth()},
    )
    assert got_status == 200


def test_the_401_says_where_the_secret_is(held: Held) -> None:
    request = urllib.request.Request(held.url + "/v1/assignments")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401
    assert refused.value.headers["WWW-Authenticate"].startswith("Bearer")
    body = json.loads(refused.value.read())
    assert str(held.pair.token_file) in body["message"], body


def test_metrics_and_health_on_their_own_port_need_no_secret(held: Held) -> None:
    metrics = held.pair.metrics_url
    assert call(held.url, "GET", "/v1/status")[0] == 401
    with urllib.request.urlopen(metrics + "/metrics", timeout=10) as response:
        text = response.read().decode()
    assert "agentq_sidecar_heartbeats_total" in text
    # Refusals are counted, by code.
    assert 'agentq_sidecar_agent_errors_total{code="Unauthorized"}' in text, text[-2000:]
    for path in ("/healthz", "/readyz"):
        with urllib.request.urlopen(metrics + path, timeout=10) as response:
            assert response.status == 200, path
    # Nothing of the agent API there; and no metrics on the API port.
    assert call(metrics, "GET", "/v1/assignments")[0] == 404
    assert call(held.url, "GET", "/metrics", headers=held.auth())[0] == 404
