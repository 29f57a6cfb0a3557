"""Bad-input corpus: manifests, through kubectl and through API clients.

Refusals: the shared catalogue of tests/builders.py (INVALID_TASKS,
INVALID_WORKERS; sent with kubectl by test_crd_validation.py) is sent here through
the Python client with strict field validation, and a catalogue of its own
(``REFUSED``: malformed JSON, wrong types, limits of names, labels, annotations,
sizes and depths) goes both through kubectl and as raw requests, as any client
would send them. Each must be refused with a message naming what is wrong, and
nothing may be stored.

Accepted but hostile (``ACCEPTED``): manifests the API server takes that the
operator must cope with: a payload nested 3,000 levels deep or close to etcd's
object limit (Failed with an ``Unprocessable`` condition, never a crash), edge
sizes and names that must simply work. After each, the operator must still run
and dispatch a canary task.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from agentq import GROUP, VERSION, protocol
from builders import INVALID_TASKS, INVALID_WORKERS, Invalid, task
from corpus import TASKS, WORKERS, Arena, Case, RawApi, cases_as_params, deep_text
from fleet import ControlPlane

# The corpus is slow (make test, not make test-fast).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

API = f"{GROUP}/{VERSION}"


@pytest.fixture(scope="module")
def namespace(control_plane: ControlPlane, agentq_crds: None) -> Iterator[str]:
    name = f"bad-manifests-{uuid.uuid4().hex[:6]}"
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def raw(control_plane: ControlPlane) -> RawApi:
    return RawApi(control_plane.kubeconfig)


def stored(control_plane: ControlPlane, namespace: str, kind: str) -> list[str]:
    done = control_plane.kubectl("-n", namespace, "get", kind, "-o", "name")
    return done.stdout.split()


# --- the shared catalogue, through the Python client ---------------------------------

CATALOGUE = [("agenttasks", c) for c in INVALID_TASKS] + [
    ("agentworkers", c) for c in INVALID_WORKERS
]


@pytest.mark.parametrize(
    ("plural", "case"), CATALOGUE, ids=[f"{p[5:-1]}-{c.id}" for p, c in CATALOGUE]
)
def test_the_invalid_catalogue_is_refused_through_the_python_client(
    control_plane: ControlPlane, namespace: str, plural: str, case: Invalid
) -> None:
    api = control_plane.api_client()
    try:
        custom = client.CustomObjectsApi(api)
        with pytest.raises(ApiException) as refused:
            custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, case.obj(), field_validation="Strict"
            )
    finally:
        api.close()
    # 422 for a schema refusal; 400 for an unknown field (strict decoding, before the schema).
    assert refused.value.status in (400, 422), refused.value.body
    assert case.field in refused.value.body and case.message in refused.value.body
    assert case.obj()["metadata"]["name"] not in " ".join(stored(control_plane, namespace, plural))


# --- refusals of our own, through kubectl and raw -------------------------------------


@dataclass(frozen=True)
class Refused:
    """A manifest (JSON text) the API server must refuse: status and a message fragment."""

    id: str
    plural: str
    text: Callable[[str], bytes]  # name -> body
    status: int
    fragment: str
    kubectl: bool = True  # also through kubectl (its own parse may refuse it first)
    content_type: str = "application/json"


def manifest(kind: str, spec: str, *, metadata: str = "") -> Callable[[str], bytes]:
    def text(name: str) -> bytes:
        meta = metadata or f'{{"name": "{name}"}}'
        head = f'{{"apiVersion": "{API}", "kind": "{kind}", "metadata": {meta}'
        return f'{head}, "spec": {spec}}}'.encode()

    return text


def t(spec: str, **kw: Any) -> Callable[[str], bytes]:
    return manifest("AgentTask", spec, **kw)


def w(spec: str, **kw: Any) -> Callable[[str], bytes]:
    return manifest("AgentWorker", spec, **kw)


def raw_text(body: bytes) -> Callable[[str], bytes]:
    return lambda _name: body


TYPE = "must be of type"
REFUSED = [
    # metadata
    Refused(
        "task-name-uppercase",
        "agenttasks",
        t("{}", metadata='{"name": "Bad-Name"}'),
        422,
        "metadata.name",
    ),
    Refused(
        "task-name-254-chars",
        "agenttasks",
        t("{}", metadata=f'{{"name": "{"a" * 254}"}}'),
        422,
        "metadata.name",
    ),
    Refused(
        "task-name-double-dot",
        "agenttasks",
        t("{}", metadata='{"name": "a..b"}'),
        422,
        "metadata.name",
    ),
    Refused(
        "task-label-with-space",
        "agenttasks",
        t("{}", metadata='{"name": "lbl", "labels": {"x": "a b"}}'),
        422,
        "metadata.labels",
    ),
    Refused(
        "task-annotations-over-256KiB",
        "agenttasks",
        t("{}", metadata=f'{{"name": "ann", "annotations": {{"x": "{"y" * 300_000}"}}}}'),
        422,
        "metadata.annotations",
    ),
    Refused(
        "task-namespace-mismatch",
        "agenttasks",
        t("{}", metadata='{"name": "nsm", "namespace": "elsewhere"}'),
        400,
        "namespace",
        kubectl=False,
    ),
    Refused(
        "task-kind-mismatch", "agenttasks", w('{"capabilities": ["a"]}'), 422, "kind", kubectl=False
    ),
    # JSON that is not JSON, or not an object
    Refused(
        "task-body-truncated",
        "agenttasks",
        raw_text(b'{"apiVersion": "agentq.dev/v1alpha1", "kind": '),
        400,
        "json",
        kubectl=False,
    ),
    Refused(
        "task-body-a-list",
        "agenttasks",
        raw_text(b"[1, 2]"),
        400,
        "cannot unmarshal array",
        kubectl=False,
    ),
    Refused(
        "task-body-as-text-plain",
        "agenttasks",
        t("{}"),
        415,
        "unknown format",
        kubectl=False,
        content_type="text/plain",
    ),
    Refused("task-cost-nan", "agenttasks", t('{"cost": NaN}'), 400, "invalid character"),
    Refused("task-cost-1e400", "agenttasks", t('{"cost": 1e400}'), 400, "1e400"),
    Refused(
        # kubectl itself keeps the last of two equal keys and sends one: raw only.
        "task-duplicate-key",
        "agenttasks",
        t('{"cost": 1, "cost": 2}'),
        400,
        "duplicate",
        kubectl=False,
    ),
    Refused(
        "task-payload-10001-deep",
        "agenttasks",
        t(f'{{"payload": {deep_text(10001)}}}'),
        400,
        "max depth",
        kubectl=False,
    ),
    # sizes
    Refused(
        "task-payload-3.5MB",
        "agenttasks",
        t(f'{{"payload": {{"x": "{"y" * 3_500_000}"}}}}'),
        413,
        "too large",
        kubectl=False,
    ),
    Refused(
        "task-payload-1.6MB",
        "agenttasks",
        t(f'{{"payload": {{"x": "{"y" * 1_600_000}"}}}}'),
        500,
        "request is too large",
        kubectl=False,
    ),
    # spec types and bounds not in the shared catalogue
    Refused("task-spec-a-list", "agenttasks", t("[]"), 422, "spec"),
    Refused("task-spec-a-string", "agenttasks", t('"run"'), 422, "spec"),
    Refused("task-payload-a-string", "agenttasks", t('{"payload": "do it"}'), 422, "spec.payload"),
    Refused(
        "task-lease-beyond-int64",
        "agenttasks",
        t('{"leaseDurationSeconds": 100000000000000000000000}'),
        422,
        "spec.leaseDurationSeconds",
    ),
    Refused(
        "task-lease-a-bool",
        "agenttasks",
        t('{"leaseDurationSeconds": true}'),
        422,
        "spec.leaseDurationSeconds",
    ),
    Refused("task-cost-a-bool", "agenttasks", t('{"cost": true}'), 422, "spec.cost"),
    Refused("task-cost-a-numeric-string", "agenttasks", t('{"cost": "1.5"}'), 422, "spec.cost"),
    Refused(
        "task-max-reclaims-1001", "agenttasks", t('{"maxReclaims": 1001}'), 422, "spec.maxReclaims"
    ),
    Refused(
        "task-max-reclaims-false",
        "agenttasks",
        t('{"maxReclaims": false}'),
        422,
        "spec.maxReclaims",
    ),
    Refused(
        "task-progress-deadline-over-a-week",
        "agenttasks",
        t('{"progressDeadlineSeconds": 604801}'),
        422,
        "spec.progressDeadlineSeconds",
    ),
    Refused(
        "task-grace-period-zero",
        "agenttasks",
        t('{"onLeaseExpiry": "GracePeriod", "gracePeriodSeconds": 0}'),
        422,
        "spec.gracePeriodSeconds",
    ),
    Refused(
        "task-heartbeat-zero",
        "agenttasks",
        t('{"heartbeatIntervalSeconds": 0}'),
        422,
        "spec.heartbeatIntervalSeconds",
    ),
    Refused(
        "task-on-expiry-lowercase",
        "agenttasks",
        t('{"onLeaseExpiry": "hold"}'),
        422,
        "spec.onLeaseExpiry",
    ),
    Refused(
        "task-backoff-initial-negative",
        "agenttasks",
        t('{"retryBackoff": {"initialSeconds": -1}}'),
        422,
        "spec.retryBackoff.initialSeconds",
    ),
    Refused(
        "task-backoff-max-over-a-day",
        "agenttasks",
        t('{"retryBackoff": {"maxSeconds": 86401}}'),
        422,
        "spec.retryBackoff.maxSeconds",
    ),
    Refused(
        "task-backoff-a-list", "agenttasks", t('{"retryBackoff": [1, 2]}'), 422, "spec.retryBackoff"
    ),
    Refused(
        "task-capability-64-chars",
        "agenttasks",
        t(f'{{"requiredCapabilities": ["{"c" * 64}"]}}'),
        422,
        "spec.requiredCapabilities[0]",
    ),
    Refused(
        "task-capability-trailing-dash",
        "agenttasks",
        t('{"requiredCapabilities": ["gpu-"]}'),
        422,
        "spec.requiredCapabilities[0]",
    ),
    Refused(
        "task-capabilities-a-string",
        "agenttasks",
        t('{"requiredCapabilities": "gpu"}'),
        422,
        "spec.requiredCapabilities",
    ),
    # workers
    Refused(
        "worker-weight-over-1000",
        "agentworkers",
        w('{"capabilities": ["a"], "weight": 1000.5}'),
        422,
        "spec.weight",
    ),
    Refused(
        "worker-weight-a-bool",
        "agentworkers",
        w('{"capabilities": ["a"], "weight": true}'),
        422,
        "spec.weight",
    ),
    Refused(
        "worker-weight-a-numeric-string",
        "agentworkers",
        w('{"capabilities": ["a"], "weight": "2"}'),
        422,
        "spec.weight",
    ),
    Refused(
        "worker-max-in-flight-1001",
        "agentworkers",
        w('{"capabilities": ["a"], "maxInFlight": 1001}'),
        422,
        "spec.maxInFlight",
    ),
    Refused(
        "worker-max-in-flight-a-string",
        "agentworkers",
        w('{"capabilities": ["a"], "maxInFlight": "2"}'),
        422,
        "spec.maxInFlight",
    ),
    Refused(
        "worker-max-in-flight-fractional",
        "agentworkers",
        w('{"capabilities": ["a"], "maxInFlight": 1.5}'),
        422,
        "spec.maxInFlight",
    ),
    Refused(
        "worker-paused-a-string",
        "agentworkers",
        w('{"capabilities": ["a"], "paused": "true"}'),
        422,
        "spec.paused",
    ),
    Refused(
        "worker-capabilities-a-string",
        "agentworkers",
        w('{"capabilities": "gpu"}'),
        422,
        "spec.capabilities",
    ),
    Refused(
        "worker-capabilities-duplicated",
        "agentworkers",
        w('{"capabilities": ["gpu", "gpu"]}'),
        422,
        "spec.capabilities[1]",
    ),
    Refused(
        "worker-capability-uppercase",
        "agentworkers",
        w('{"capabilities": ["GPU"]}'),
        422,
        "spec.capabilities[0]",
    ),
    Refused("worker-spec-a-list", "agentworkers", w("[]"), 422, "spec"),
    Refused(
        "worker-weight-1e400",
        "agentworkers",
        w('{"capabilities": ["a"], "weight": 1e400}'),
        400,
        "1e400",
    ),
]


def _refused_ids() -> list[Any]:
    params = []
    for case in REFUSED:
        params.append(pytest.param(case, "raw", id=f"{case.id}-raw"))
        if case.kubectl:
            params.append(pytest.param(case, "kubectl", id=f"{case.id}-kubectl"))
    return params


@pytest.mark.parametrize(("case", "path"), _refused_ids())
def test_a_bad_manifest_is_refused_with_a_clear_message(
    control_plane: ControlPlane, namespace: str, raw: RawApi, case: Refused, path: str
) -> None:
    name = f"{case.id[:40]}-{path}".lower().replace(".", "-")
    body = case.text(name)
    before = stored(control_plane, namespace, case.plural)
    if path == "raw":
        status, answer = raw.request(
            "POST",
            (TASKS if case.plural == "agenttasks" else WORKERS).format(ns=namespace)
            + "?fieldValidation=Strict",
            body,
            content_type=case.content_type,
        )
        message = RawApi.message(answer)
        assert status == case.status, (status, message[:500])
        assert case.fragment.lower() in message.lower(), message[:500]
    else:
        done = subprocess.run(
            [control_plane.kubectl_path, "-n", namespace, "create", "-f", "-"],
            input=body,
            capture_output=True,
            timeout=120,
            check=False,
            env=control_plane.env(),
        )
        output = (done.stdout + done.stderr).decode(errors="replace")
        assert done.returncode != 0, output[:500]
        # kubectl parses JSON itself: malformed JSON is refused before the API server.
        assert case.fragment.lower() in output.lower() or "error" in output.lower(), output[:500]
    assert stored(control_plane, namespace, case.plural) == before


def test_status_sent_with_a_create_is_ignored(
    control_plane: ControlPlane, namespace: str, raw: RawApi
) -> None:
    body = task("sneaky-status").obj()
    body["status"] = {"phase": "Succeeded", "fencingToken": 99, "result": "forged"}
    status, answer = raw.request("POST", TASKS.format(ns=namespace), json.dumps(body).encode())
    assert status == 201, answer
    # The status subresource drops what a create carries; at most the CRD's default is there.
    assert answer.get("status", {}) in ({}, {"phase": "Pending"}), answer.get("status")


# --- accepted, and the operator must cope ---------------------------------------------


@pytest.fixture(scope="module")
def arena(
    control_plane: ControlPlane, agentq_crds: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Arena]:
    arena = Arena(control_plane, tmp_path_factory.mktemp("bad-manifests"), puppets=("pa",))
    try:
        yield arena
    finally:
        arena.close()


def create_raw(arena: Arena, name: str, spec_text: str, *, kind: str = "AgentTask") -> None:
    plural = TASKS if kind == "AgentTask" else WORKERS
    body = manifest(kind, spec_text)(name)
    status, answer = arena.raw.request("POST", plural.format(ns=arena.namespace), body)
    assert status == 201, (status, RawApi.message(answer)[:300])


def unprocessable(reason: str, spec_text: Callable[[], str]) -> Callable[[Arena], None]:
    """The API server stores it; the operator must fail it visibly, once, and move on."""

    def run(arena: Arena) -> None:
        name = arena.name(f"unprocessable-{reason.lower()}")
        mark = arena.log_mark()
        create_raw(arena, name, spec_text())

        def status() -> dict[str, Any]:
            return arena.task_raw(name).get("status") or {}

        arena.wait(f"{name} Failed", lambda: status().get("phase") == "Failed", timeout=30)
        final = status()
        condition = next(c for c in final.get("conditions") or [] if c["type"] == "Unprocessable")
        assert condition["status"] == "True" and condition["reason"] == reason, condition
        arena.wait(
            f"an event on {name}",
            lambda: bool({"Unprocessable", reason} & set(arena.reasons(name))),
            timeout=10,
        )
        assert arena.metric("agentq_unprocessable_total", reason=reason) >= 1
        assert final.get("attempt", 0) == 0 and arena.fleet.task_lease(name) is None
        arena.check()  # others are still served while it sits there
        errors = arena.errors_since(mark)
        assert len(errors) <= 3, "errors every pass:\n" + "\n".join(errors[:3])

    return run


def succeeds(spec_text: Callable[[], str], *, name: str | None = None) -> Callable[[Arena], None]:
    """Accepted and unremarkable for the operator: dispatched to the canary worker, done."""

    def run(arena: Arena) -> None:
        task_name = name or arena.name("edge")
        create_raw(arena, task_name, spec_text())
        try:
            done = arena.fleet.wait_phase(task_name, "Succeeded", timeout=30)["status"]
            assert done["attempt"] == 1
            assert done["leaseName"] == protocol.task_lease_name(task_name)
        finally:
            arena.delete_task(task_name)

    return run


def canary_spec(extra: str = "") -> Callable[[], str]:
    return lambda: (
        f'{{"requiredCapabilities": ["{Arena.CANARY}"], "leaseDurationSeconds": 5{extra}}}'
    )


def invalid_utf8_payload(arena: Arena) -> None:
    """The API server takes bytes that are not UTF-8 (it stores U+FFFD for them)."""
    name = arena.name("not-utf8")
    body = manifest("AgentTask", canary_spec()())(name).replace(
        b'"leaseDurationSeconds": 5', b'"leaseDurationSeconds": 5, "payload": {"k": "\xff\xfe"}'
    )
    status, answer = arena.raw.request("POST", TASKS.format(ns=arena.namespace), body)
    assert status == 201, answer
    arena.fleet.wait_phase(name, "Succeeded", timeout=30)


def near_etcd_limit(arena: Arena, prefix: str, under: int) -> str:
    """A task ``under`` bytes below the largest payload etcd takes (found by probes under
    a name of the same length: etcd counts the key); returns its name."""
    name = arena.name(prefix)

    def body(n: int, name: str = "p" * len(name)) -> dict[str, Any]:
        return task(name).requires(Arena.CANARY).payload({"x": "y" * n}).obj()

    top = arena.fleet.largest_creatable(body, 1_560_000, 1_580_000)
    arena.custom.create_namespaced_custom_object(
        GROUP, VERSION, arena.namespace, "agenttasks", body(top - under, name)
    )
    return name


def payload_near_the_etcd_limit(arena: Arena) -> None:
    """~1.5 MB, 300 bytes under what etcd takes: the object fits, its ObjectTooLarge status
    beside it does not. It stayed Pending for good (an event every 10 minutes); it now
    ends Failed / ObjectTooLarge in a smaller status write."""
    mark = arena.log_mark()
    name = near_etcd_limit(arena, "near-etcd-limit", 300)
    arena.wait(
        f"{name} Failed",
        lambda: (arena.task_raw(name).get("status") or {}).get("phase") == "Failed",
        timeout=30,
    )
    assert arena.task_raw(name)["status"]["error"]["reason"] == "ObjectTooLarge"
    arena.wait(f"an event on {name}", lambda: "Unprocessable" in arena.reasons(name))
    assert arena.metric("agentq_unprocessable_total", reason="ObjectTooLarge") >= 1
    assert arena.fleet.task_lease(name) is None
    arena.check()
    errors = arena.errors_since(mark)
    assert len(errors) <= 3, "errors every pass:\n" + "\n".join(errors[:3])


def payload_at_the_etcd_limit(arena: Arena) -> None:
    """The largest payload etcd takes: no write of any kind fits beside it any more. The
    operator cannot fail it in its status: it says so with an event and a metric, once,
    dispatches nothing, and goes on serving the others (docs/operator.md, "Known
    limits")."""
    mark = arena.log_mark()
    name = near_etcd_limit(arena, "at-etcd-limit", 0)
    arena.wait(f"an event on {name}", lambda: "Unprocessable" in arena.reasons(name))
    assert arena.metric("agentq_unprocessable_total", reason="Unwritable") >= 1
    assert arena.fleet.task_lease(name) is None
    arena.check()
    time.sleep(3)  # a few more passes over it
    assert arena.reasons(name) == ["Unprocessable"], arena.reasons(name)
    assert (arena.task_raw(name).get("status") or {}).get("phase", "Pending") == "Pending"
    errors = arena.errors_since(mark)
    assert len(errors) <= 3, "errors every pass:\n" + "\n".join(errors[:3])


def tiny_weight_worker_status(arena: Arena) -> None:
    arena.custom.patch_namespaced_custom_object(
        GROUP, VERSION, arena.namespace, "agentworkers", "pa", {"spec": {"weight": 0.001}}
    )
    try:
        p = arena.puppets["pa"]
        for _ in range(3):
            p.finish(p.submit("tiny-weight", lambda b: b.cost(1000)))
        status = arena.fleet.worker("pa").get("status") or {}
        assert status.get("phase") == "Ready" and isinstance(status.get("deficit"), int | float)
    finally:
        arena.custom.patch_namespaced_custom_object(
            GROUP, VERSION, arena.namespace, "agentworkers", "pa", {"spec": {"weight": 1}}
        )


def unknown_field_without_strict_validation(arena: Arena) -> None:
    name = arena.name("lenient")
    body = task(name).requires(Arena.CANARY).set("spec.urgency", 5).obj()
    arena.custom.create_namespaced_custom_object(
        GROUP, VERSION, arena.namespace, "agenttasks", body
    )
    try:
        assert "urgency" not in arena.task(name)["spec"]  # pruned, as docs/api.md says
        arena.fleet.wait_phase(name, "Succeeded", timeout=30)
    finally:
        arena.delete_task(name)


def generated_name_at_the_limit(arena: Arena) -> None:
    body = task("unused").requires(Arena.CANARY).obj()
    del body["metadata"]["name"]
    body["metadata"]["generateName"] = "g" * 60
    created = arena.custom.create_namespaced_custom_object(
        GROUP, VERSION, arena.namespace, "agenttasks", body
    )
    name = created["metadata"]["name"]
    assert len(name) <= 63
    try:
        arena.fleet.wait_phase(name, "Succeeded", timeout=30)
    finally:
        arena.delete_task(name)


# The lead's note calls it MAX_PAYLOAD_DEPTH; the controller branch MAX_JSON_DEPTH. 64 either way.
PAYLOAD_DEPTH = int(
    getattr(protocol, "MAX_PAYLOAD_DEPTH", None) or getattr(protocol, "MAX_JSON_DEPTH", 64)
)

ACCEPTED = [
    Case(
        "payload-3000-levels-deep",
        unprocessable("PayloadTooDeep", lambda: f'{{"payload": {deep_text(3000)}}}'),
    ),
    Case(
        "payload-500-levels-deep",
        unprocessable("PayloadTooDeep", lambda: f'{{"payload": {deep_text(500)}}}'),
    ),
    Case(
        "payload-one-level-too-deep",
        unprocessable("PayloadTooDeep", lambda: f'{{"payload": {deep_text(PAYLOAD_DEPTH + 1)}}}'),
    ),
    Case(
        "payload-over-256KiB",
        unprocessable("PayloadTooLarge", lambda: f'{{"payload": {{"x": "{"y" * 300_000}"}}}}'),
    ),
    Case("payload-near-the-etcd-limit", payload_near_the_etcd_limit),
    Case("payload-at-the-etcd-limit", payload_at_the_etcd_limit),
    Case(
        "payload-at-the-depth-limit",
        succeeds(canary_spec(f', "payload": {deep_text(PAYLOAD_DEPTH - 1)}')),
    ),
    Case(
        "payload-just-under-256KiB",
        succeeds(canary_spec(f', "payload": {{"x": "{"y" * 250_000}"}}')),
    ),
    Case(
        "payload-128-keys",
        succeeds(canary_spec(', "payload": ' + json.dumps({f"k{i}": i for i in range(128)}))),
    ),
    Case(
        "payload-nul-emoji-lone-surrogate",
        succeeds(
            canary_spec(', "payload": {"nul": "a\\u0000b", "\\ud83d\\ude00": "x", "s": "\\ud800"}')
        ),
    ),
    Case("payload-null", succeeds(canary_spec(', "payload": null'))),
    Case("payload-invalid-utf8", invalid_utf8_payload),
    Case("cost-one-billionth", succeeds(canary_spec(', "cost": 1e-9'))),
    Case("cost-a-million", succeeds(canary_spec(', "cost": 1000000'))),
    Case(
        "lease-30.0-as-a-float",
        succeeds(
            lambda: f'{{"requiredCapabilities": ["{Arena.CANARY}"], "leaseDurationSeconds": 30.0}}'
        ),
    ),
    Case("task-name-with-dots", succeeds(canary_spec(), name="a.b.c.d")),
    Case("task-name-63-chars", succeeds(canary_spec(), name="n" * 63)),
    Case("generated-name-at-the-limit", generated_name_at_the_limit),
    Case("unknown-field-pruned-without-strict-validation", unknown_field_without_strict_validation),
    Case("worker-at-the-minimum-weight", tiny_weight_worker_status),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", cases_as_params(ACCEPTED))
def test_an_accepted_hostile_manifest_is_handled(arena: Arena, case: Case) -> None:
    with arena.case():
        case.run(arena)
