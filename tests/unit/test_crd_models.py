"""The CRD schemas in crds/ and the pydantic models in agentq.models agree.

Both sides are reduced to the same comparable facts per field (type, format,
enum, default after Kubernetes-style nested defaulting, bounds with their
exclusiveness, string and list constraints, set semantics, required fields,
opaque objects) and compared field by field, so changing one without the other
fails here with the path of every difference. Each CEL rule of the CRDs must
have a check in the models raising the same message, proven on the shared
catalogue of invalid manifests in tests/builders.py (which the integration
tests send to the real API server).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from agentq.models import (
    AgentBudgetSpec,
    AgentBudgetStatus,
    AgentQueueSpec,
    AgentQueueStatus,
    AgentTaskSpec,
    AgentTaskStatus,
    AgentWorkerSpec,
    AgentWorkerStatus,
    AttemptOutcome,
    AttemptRecord,
    BudgetUsage,
    BudgetWindow,
    Condition,
    ConditionStatus,
    ModelError,
    RetryBackoff,
    TaskError,
    TaskPhase,
    WindowBucket,
    condition_reason,
    parse_budget,
    parse_queue,
    parse_task,
    parse_task_spec,
    parse_task_status,
    parse_worker,
    parse_worker_status,
)
from builders import (
    INVALID_BUDGETS,
    INVALID_QUEUES,
    INVALID_TASKS,
    INVALID_WORKERS,
    Invalid,
    budget,
    queue,
    task,
    worker,
)

pytestmark = pytest.mark.unit

CRDS = Path(__file__).resolve().parents[2] / "crds"
Schema = dict[str, Any]


def load_crd(plural: str) -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load((CRDS / f"{plural}.agentq.dev.yaml").read_text())
    return crd


def root_schema(plural: str) -> Schema:
    (version,) = load_crd(plural)["spec"]["versions"]
    schema: Schema = version["schema"]["openAPIV3Schema"]
    return schema


# --- reducing both sides to comparable facts --------------------------------------


def apply_defaults(schema: Schema, value: Any) -> Any:
    """Kubernetes structural defaulting: fill in missing defaults, recursively."""
    if isinstance(value, dict) and schema.get("type") == "object":
        out = dict(value)
        for key, sub in schema.get("properties", {}).items():
            if key not in out and "default" in sub:
                out[key] = copy.deepcopy(sub["default"])
            if key in out:
                out[key] = apply_defaults(sub, out[key])
        return out
    if isinstance(value, list) and schema.get("type") == "array":
        return [apply_defaults(schema["items"], item) for item in value]
    return value


_SCALAR_KEYS = (
    "type",
    "format",
    "enum",
    "pattern",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "maxProperties",
)


def crd_facts(node: Schema) -> dict[str, Any]:
    """The comparable facts of one CRD schema node."""
    if node.get("x-kubernetes-preserve-unknown-fields"):
        return {"opaque": node.get("type", "any")}
    facts: dict[str, Any] = {k: node[k] for k in _SCALAR_KEYS if k in node}
    if "minimum" in node:
        facts["minimum"] = (node["minimum"], bool(node.get("exclusiveMinimum")))
    if "maximum" in node:
        facts["maximum"] = (node["maximum"], bool(node.get("exclusiveMaximum")))
    if node.get("x-kubernetes-list-type") == "set":
        facts["set"] = True
    if "default" in node:
        facts["default"] = apply_defaults(node, node["default"])
    if node.get("type") == "object" and "additionalProperties" in node:
        facts["values"] = crd_facts(node["additionalProperties"])  # a map (matchLabels)
    elif node.get("type") == "object":
        facts["required"] = sorted(node.get("required", []))
        facts["properties"] = {k: crd_facts(v) for k, v in node.get("properties", {}).items()}
    if node.get("type") == "array":
        facts["items"] = crd_facts(node["items"])
    return facts


def _resolve(node: Schema, defs: dict[str, Schema]) -> Schema:
    """Inline $ref and drop the null branch of Optional[...] (None means "absent")."""
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    if "anyOf" in node:
        branches = [b for b in node["anyOf"] if b != {"type": "null"}]
        rest = {k: v for k, v in node.items() if k != "anyOf"}
        if len(branches) == 1:
            node = {**_resolve(branches[0], defs), **rest}
    return node


def model_facts(node: Schema, defs: dict[str, Schema]) -> dict[str, Any]:
    """The comparable facts of one node of a pydantic JSON schema."""
    node = _resolve(node, defs)
    if "type" not in node or "anyOf" in node:
        return {"opaque": "any"}  # JsonValue
    values = node.get("additionalProperties")
    if node["type"] == "object" and isinstance(values, dict) and "type" in values:
        facts = {k: node[k] for k in _SCALAR_KEYS if k in node}
        return {**facts, "values": model_facts(values, defs)}  # dict[str, str]
    if node["type"] == "object" and "properties" not in node:
        return {"opaque": "object"}  # dict[str, JsonValue]
    facts: dict[str, Any] = {k: node[k] for k in _SCALAR_KEYS if k in node}
    if "exclusiveMinimum" in node:
        facts["minimum"] = (node["exclusiveMinimum"], True)
    elif "minimum" in node:
        facts["minimum"] = (node["minimum"], False)
    if "exclusiveMaximum" in node:
        facts["maximum"] = (node["exclusiveMaximum"], True)
    elif "maximum" in node:
        facts["maximum"] = (node["maximum"], False)
    if node.get("uniqueItems"):
        facts["set"] = True
    if node.get("default") is not None:
        facts["default"] = node["default"]
    if node["type"] == "object":
        facts["required"] = sorted(node.get("required", []))
        facts["properties"] = {
            k: model_facts(v, defs) for k, v in node.get("properties", {}).items()
        }
    if node["type"] == "array":
        facts["items"] = model_facts(node["items"], defs)
    return facts


def model_schema_facts(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True, mode="validation")
    return model_facts(schema, schema.get("$defs", {}))


def differences(crd: Any, model: Any, path: str = "") -> Iterator[str]:
    """Every place where the two fact trees disagree, as readable lines."""
    if isinstance(crd, dict) and isinstance(model, dict):
        for key in sorted(crd.keys() | model.keys()):
            where = f"{path}.{key}" if path else key
            if key not in model:
                yield f"{where}: in the CRD ({json.dumps(crd[key])}) but not in the model"
            elif key not in crd:
                yield f"{where}: in the model ({json.dumps(model[key])}) but not in the CRD"
            else:
                yield from differences(crd[key], model[key], where)
    elif crd != model:
        yield f"{path}: CRD says {crd!r}, model says {model!r}"


PAIRS: list[tuple[str, str, type[BaseModel]]] = [
    ("agenttasks", "spec", AgentTaskSpec),
    ("agenttasks", "status", AgentTaskStatus),
    ("agentworkers", "spec", AgentWorkerSpec),
    ("agentworkers", "status", AgentWorkerStatus),
    ("agentqueues", "spec", AgentQueueSpec),
    ("agentqueues", "status", AgentQueueStatus),
    ("agentbudgets", "spec", AgentBudgetSpec),
    ("agentbudgets", "status", AgentBudgetStatus),
]


@pytest.mark.parametrize(
    ("plural", "part", "model"), PAIRS, ids=[f"{p}.{part}" for p, part, _ in PAIRS]
)
def test_crd_schema_and_model_agree(plural: str, part: str, model: type[BaseModel]) -> None:
    crd = crd_facts(root_schema(plural)["properties"][part])
    crd.pop("default", None)  # the spec's own `default: {}`, checked in the next test
    found = list(differences(crd, model_schema_facts(model)))
    assert not found, f"crds/{plural} .{part} and {model.__name__} disagree:\n" + "\n".join(found)


def test_a_task_needs_no_spec_and_a_worker_does() -> None:
    tasks, workers = root_schema("agenttasks"), root_schema("agentworkers")
    assert tasks["properties"]["spec"]["default"] == {}
    assert "spec" not in tasks.get("required", [])
    assert parse_task(task("t").unset("spec").obj()).spec == AgentTaskSpec()
    assert workers["required"] == ["spec"]
    with pytest.raises(ModelError, match="spec"):
        parse_worker(worker("w").unset("spec").obj())


MUTATIONS: dict[str, Callable[[Schema], None]] = {
    "drop a field": lambda s: s["properties"]["spec"]["properties"].pop("cost"),
    "add a field": lambda s: s["properties"]["spec"]["properties"].update(
        {"urgency": {"type": "integer"}}
    ),
    "change a default": lambda s: s["properties"]["spec"]["properties"][
        "leaseDurationSeconds"
    ].update(default=60),
    "change a nested default": lambda s: s["properties"]["spec"]["properties"]["retryBackoff"][
        "properties"
    ]["jitter"].update(default=0.5),
    "change a bound": lambda s: s["properties"]["spec"]["properties"]["cost"].update(maximum=10),
    "make a bound inclusive": lambda s: s["properties"]["spec"]["properties"]["cost"].pop(
        "exclusiveMinimum"
    ),
    "add an enum value": lambda s: s["properties"]["spec"]["properties"]["onLeaseExpiry"][
        "enum"
    ].append("Ignore"),
    "change a pattern": lambda s: s["properties"]["spec"]["properties"]["requiredCapabilities"][
        "items"
    ].update(pattern="^.*$"),
    "drop set semantics": lambda s: s["properties"]["spec"]["properties"][
        "requiredCapabilities"
    ].pop("x-kubernetes-list-type"),
    "change a type": lambda s: s["properties"]["spec"]["properties"]["maxReclaims"].update(
        type="number"
    ),
    "require a field": lambda s: s["properties"]["status"]["properties"]["history"]["items"][
        "required"
    ].append("reason"),
    "change a status enum": lambda s: s["properties"]["status"]["properties"]["phase"][
        "enum"
    ].remove("Held"),
    "drop a format": lambda s: s["properties"]["status"]["properties"]["notBefore"].pop("format"),
    "make a field opaque": lambda s: s["properties"]["status"]["properties"]["error"].update(
        {"x-kubernetes-preserve-unknown-fields": True}
    ),
}


@pytest.mark.parametrize("mutate", MUTATIONS.values(), ids=MUTATIONS.keys())
def test_the_agreement_check_notices_drift(mutate: Callable[[Schema], None]) -> None:
    schema = copy.deepcopy(root_schema("agenttasks"))
    mutate(schema)
    found = [
        line
        for part, model in (("spec", AgentTaskSpec), ("status", AgentTaskStatus))
        for line in differences(
            {k: v for k, v in crd_facts(schema["properties"][part]).items() if k != "default"},
            model_schema_facts(model),
        )
    ]
    assert found


# --- CEL rules: one model check per rule, same message ----------------------------


def cel_rules(node: Schema) -> Iterator[dict[str, str]]:
    yield from node.get("x-kubernetes-validations", [])
    for sub in node.get("properties", {}).values():
        yield from cel_rules(sub)
    if "items" in node:
        yield from cel_rules(node["items"])


def _message(rule: dict[str, str]) -> str:
    return rule["message"].strip()


def _is_transition(rule: dict[str, str]) -> bool:
    return "oldSelf" in rule["rule"]


@pytest.mark.parametrize(
    ("plural", "cases"),
    [
        ("agenttasks", INVALID_TASKS),
        ("agentworkers", INVALID_WORKERS),
        ("agentqueues", INVALID_QUEUES),
        ("agentbudgets", INVALID_BUDGETS),
    ],
)
def test_every_cel_rule_has_an_invalid_case(plural: str, cases: tuple[Invalid, ...]) -> None:
    rules = [r for r in cel_rules(root_schema(plural)) if not _is_transition(r)]
    assert rules
    for rule in rules:
        assert any(c.message and _message(rule).startswith(c.message) for c in cases), (
            f"no case in tests/builders.py exercises the CEL rule {rule['rule']!r}"
        )


def test_transition_rules_are_the_immutable_fields() -> None:
    # Transition rules need the old object, which the models never see: the
    # integration tests check them on the API server.
    rules = [r for r in cel_rules(root_schema("agenttasks")) if _is_transition(r)]
    assert sorted(_message(r) for r in rules) == [
        "budgets is immutable",
        "cost is immutable",
        "payload is immutable",
        "queue is immutable",
        "requiredCapabilities is immutable",
    ]
    assert not [r for r in cel_rules(root_schema("agentworkers")) if _is_transition(r)]
    assert not [r for r in cel_rules(root_schema("agentqueues")) if _is_transition(r)]
    assert not [r for r in cel_rules(root_schema("agentbudgets")) if _is_transition(r)]


def _all_cases() -> list[tuple[str, Invalid]]:
    return (
        [("agenttasks", c) for c in INVALID_TASKS]
        + [("agentworkers", c) for c in INVALID_WORKERS]
        + [("agentqueues", c) for c in INVALID_QUEUES]
        + [("agentbudgets", c) for c in INVALID_BUDGETS]
    )


PARSERS: dict[str, Callable[[dict[str, Any]], object]] = {
    "agenttasks": parse_task,
    "agentworkers": parse_worker,
    "agentqueues": parse_queue,
    "agentbudgets": parse_budget,
}


@pytest.mark.parametrize(
    ("plural", "case"), _all_cases(), ids=[f"{p}-{c.id}" for p, c in _all_cases()]
)
def test_the_models_refuse_what_the_api_server_refuses(plural: str, case: Invalid) -> None:
    parse = PARSERS[plural]
    if not case.model_refuses:
        parse(case.obj())  # ignored (the API server refuses it: see the integration tests)
        return
    with pytest.raises(ModelError) as refused:
        parse(case.obj())
    error = str(refused.value)
    leaf = case.field.rsplit(".", 1)[-1].split("[")[0]
    assert leaf in error, f"the model's error does not name {leaf}: {error}"
    # A CEL case: the model raises the rule's full message, word for word. (Other
    # messages are the API server's wording, checked by the integration tests.)
    for rule in cel_rules(root_schema(plural)):
        if case.message and _message(rule).startswith(case.message):
            assert _message(rule) in error


# --- defaults ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "manifest",
    [
        task("minimal").obj(),
        task("no-spec").unset("spec").obj(),
        task("some").requires("gpu").cost(2.5).backoff(initial=0.5).lease(60).obj(),
        task("grace").on_expiry("GracePeriod", grace=5).payload({"prompt": "hi", "n": [1]}).obj(),
        task("budgets").budget("openai", tokens=800).budget("search").obj(),
    ],
    ids=["minimal", "no-spec", "some-fields", "grace", "budgets"],
)
def test_model_defaults_are_the_api_server_defaults(manifest: dict[str, Any]) -> None:
    defaulted = apply_defaults(root_schema("agenttasks"), manifest)
    assert parse_task(manifest).spec.to_dict() == defaulted["spec"]


def test_queue_defaults() -> None:
    manifest = queue("q").obj()
    defaulted = apply_defaults(root_schema("agentqueues"), manifest)
    assert defaulted["spec"] == {"weight": 1}
    assert parse_queue(manifest).spec.to_dict() == defaulted["spec"]
    assert parse_queue(queue("q").unset("spec").obj()).spec == AgentQueueSpec()


def test_budget_defaults() -> None:
    manifest = budget("b").obj()
    defaulted = apply_defaults(root_schema("agentbudgets"), manifest)
    assert defaulted["spec"] == {}
    assert parse_budget(manifest).spec == AgentBudgetSpec()
    assert parse_budget(budget("b").unset("spec").obj()).spec == AgentBudgetSpec()
    limits = budget("b").requests_per_minute(60).tokens_per_minute(6000).max_concurrent(2)
    assert parse_budget(limits.obj()).spec.to_dict() == {
        "requestsPerMinute": 60,
        "tokensPerMinute": 6000,
        "maxConcurrent": 2,
    }


def test_a_tasks_budget_estimates_default_to_one_request_and_no_tokens() -> None:
    spec = parse_task(task("t").budget("openai", tokens=800).budget("search").obj()).spec
    assert spec.budgets is not None
    assert [(b.name, b.requests, b.tokens) for b in spec.budgets] == [
        ("openai", 1, 800),
        ("search", 1, 0),
    ]
    assert parse_task(task("t").obj()).spec.budgets is None
    with pytest.raises(ValueError, match="frozen"):
        spec.budgets = ()


def test_an_attempts_usage_names_each_budget_once() -> None:
    now = datetime(2025, 1, 1, tzinfo=UTC)
    usage = [BudgetUsage(name="openai", requests=3, tokens=2900)]
    record = AttemptRecord(outcome=AttemptOutcome.SUCCEEDED, time=now, usage=usage)
    assert record.to_dict()["usage"] == [{"name": "openai", "requests": 3, "tokens": 2900}]
    with pytest.raises(ValueError, match="usage must not repeat 'openai'"):
        AttemptRecord(outcome=AttemptOutcome.FAILED, time=now, usage=usage * 2)


def test_a_budget_status_round_trips_through_json() -> None:
    now = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    status = AgentBudgetStatus(
        in_use=2,
        used_requests=40,
        used_tokens=4000,
        reserved_requests=2,
        reserved_tokens=2000,
        available_requests=18,
        available_tokens=0,
        available_concurrency=0,
        throttled_until=now,
        waiting=7,
        window=BudgetWindow(
            as_of=now,
            bucket_seconds=5,
            buckets=[WindowBucket(start=now, requests=3, tokens=300)],
        ),
        observed_generation=1,
    )
    wire = status.to_dict()
    assert wire["window"] == {
        "asOf": "2025-01-02T03:04:05Z",
        "bucketSeconds": 5,
        "buckets": [{"start": "2025-01-02T03:04:05Z", "requests": 3, "tokens": 300}],
    }
    assert AgentBudgetStatus.model_validate(json.loads(json.dumps(wire))) == status
    with pytest.raises(ValueError, match="bucket_seconds"):
        BudgetWindow(as_of=now, bucket_seconds=0)


@pytest.mark.parametrize(
    ("selector", "labels", "admitted"),
    [
        (None, {"team": "a"}, False),
        ({}, {}, True),
        ({"matchLabels": {"team": "a"}}, {"team": "a", "x": "y"}, True),
        ({"matchLabels": {"team": "a"}}, {"team": "b"}, False),
        (
            {"matchExpressions": [{"key": "team", "operator": "In", "values": ["a", "b"]}]},
            {"team": "b"},
            True,
        ),
        ({"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["a"]}]}, {}, True),
        ({"matchExpressions": [{"key": "team", "operator": "Exists"}]}, {}, False),
        ({"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]}, {}, True),
    ],
)
def test_a_queue_admits_the_namespaces_its_selector_selects(
    selector: dict[str, Any] | None, labels: dict[str, str], admitted: bool
) -> None:
    spec = queue("q")
    if selector is not None:
        spec = spec.set("spec.namespaceSelector", selector)
    assert parse_queue(spec.obj()).spec.admits(labels) is admitted


def test_worker_defaults() -> None:
    manifest = worker("w", "gpu").obj()
    defaulted = apply_defaults(root_schema("agentworkers"), manifest)
    assert defaulted["spec"] == {
        "capabilities": ["gpu"],
        "weight": 1,
        "maxInFlight": 1,
        "paused": False,
    }
    assert parse_worker(manifest).spec.to_dict() == defaulted["spec"]


# --- the models themselves --------------------------------------------------------


def test_capabilities_are_sets_on_the_python_side_and_sorted_lists_on_the_wire() -> None:
    w = parse_worker(worker("w", "gpu", "cpu", "big-mem").obj())
    t = parse_task(task("t").requires("gpu", "cpu").obj())
    assert w.spec.covers(t.spec.required_capabilities)
    assert not parse_worker(worker("v", "cpu").obj()).spec.covers(t.spec.required_capabilities)
    assert w.spec.to_dict()["capabilities"] == ["big-mem", "cpu", "gpu"]
    assert w.lease_name == "agentq-worker-w"


def test_effective_heartbeat_and_max_reclaims() -> None:
    spec = parse_task_spec({"leaseDurationSeconds": 10})
    assert spec.effective_heartbeat_interval_seconds == pytest.approx(10 / 3)
    assert (
        parse_task_spec({"heartbeatIntervalSeconds": 4}).effective_heartbeat_interval_seconds == 4
    )
    assert spec.effective_max_reclaims(5) == 5
    assert parse_task_spec({"maxReclaims": 0}).effective_max_reclaims(5) == 0


def test_specs_are_immutable_and_statuses_check_assignments() -> None:
    spec = parse_task_spec({})
    with pytest.raises(ValueError, match="frozen"):
        spec.cost = 3
    status = AgentTaskStatus()
    status.phase = TaskPhase.RUNNING
    with pytest.raises(ValueError, match="phase"):
        status.phase = "Exploded"  # type: ignore[assignment]


def test_status_round_trips_through_json() -> None:
    now = datetime(2025, 1, 2, 3, 4, 5, 600000, tzinfo=UTC)
    status = AgentTaskStatus(
        phase=TaskPhase.SUCCEEDED,
        worker="w1",
        attempt=2,
        reclaims=1,
        fencing_token=7,
        lease_name="agentq-task-t1",
        assigned_at=now,
        finished_at=now,
        progress="3/10",
        grace_until=now,
        result_ref="s3://bucket/result.json",
        requeue_handled="20250102T030405Z-abcd1234",
        result={"answer": 42, "refs": ["s3://bucket/key"]},
        error=TaskError(reason="OOM", message="killed", retryable=True),
        history=[
            AttemptRecord(
                worker="w0",
                token=6,
                attempt=1,
                outcome=AttemptOutcome.FAILED,
                reason="LeaseExpired",
                time=now,
            ),
            AttemptRecord(outcome=AttemptOutcome.REQUEUED, reason="Requeued", time=now),
        ],
        conditions=[
            Condition(
                type="Complete",
                status=ConditionStatus.TRUE,
                last_transition_time=now,
                reason="Succeeded",
                message="",
            )
        ],
    )
    wire = status.to_dict()
    assert wire["assignedAt"] == "2025-01-02T03:04:05.600000Z"
    assert wire["history"][0]["outcome"] == "Failed"
    assert wire["history"][1] == {
        "outcome": "Requeued",
        "reason": "Requeued",
        "time": wire["assignedAt"],
    }
    assert "notBefore" not in wire
    assert parse_task_status(json.loads(json.dumps(wire))) == status
    assert parse_task_status(None) == AgentTaskStatus()
    assert parse_worker_status({"phase": "Ready", "assignedTasks": ["b", "a"]}).to_dict() == {
        "phase": "Ready",
        "assignedTasks": ["a", "b"],
    }


def test_a_patch_holds_the_given_fields_and_clears_the_given_nones() -> None:
    now = datetime(2025, 1, 1, tzinfo=UTC)
    patch = AgentTaskStatus(
        phase=TaskPhase.PENDING, worker=None, not_before=now, error=TaskError(retryable=False)
    ).to_patch()
    assert patch == {
        "phase": "Pending",
        "worker": None,
        "notBefore": "2025-01-01T00:00:00Z",
        "error": {"retryable": False},
    }


def test_unknown_fields_are_ignored_when_parsing() -> None:
    spec = parse_task_spec({"cost": 2, "urgency": 9})
    assert spec.cost == 2
    assert "urgency" not in spec.to_dict()


def test_parse_accepts_read_only_mappings_like_kopf_bodies() -> None:
    from types import MappingProxyType

    body = MappingProxyType(
        {"metadata": MappingProxyType({"name": "t", "namespace": "ns"}), "spec": {"cost": 3}}
    )
    parsed = parse_task(body)
    assert (parsed.namespace, parsed.name, parsed.spec.cost) == ("ns", "t", 3)


def test_model_errors_name_the_object() -> None:
    with pytest.raises(ModelError, match=r"AgentTask ns/t .*spec\.cost"):
        parse_task(task("t").namespace("ns").cost(-1).obj())


def test_timestamps_must_carry_a_timezone() -> None:
    with pytest.raises(ModelError, match="timezone"):
        parse_task_status({"assignedAt": "2025-01-01T00:00:00"})


def test_history_is_bounded() -> None:
    now = datetime.now(UTC)
    record = AttemptRecord(worker="w", token=1, attempt=1, outcome=AttemptOutcome.FAILED, time=now)
    AgentTaskStatus(history=[record] * 20)
    with pytest.raises(ValueError, match="history"):
        AgentTaskStatus(history=[record] * 21)


# --- retry backoff ----------------------------------------------------------------


def test_backoff_grows_geometrically_up_to_the_max() -> None:
    backoff = RetryBackoff(initial_seconds=1, max_seconds=10, multiplier=2, jitter=0)
    assert [backoff.delay_seconds(n, rand=0.5) for n in range(0, 7)] == [0, 1, 2, 4, 8, 10, 10]
    assert backoff.delay_seconds(10_000, rand=0) == 10


def test_backoff_jitter_takes_off_a_fraction() -> None:
    backoff = RetryBackoff(initial_seconds=8, max_seconds=8, jitter=0.25)
    assert backoff.delay_seconds(1, rand=0) == 8
    assert backoff.delay_seconds(1, rand=1) == 6


@given(
    initial=st.floats(0, 86400),
    spread=st.floats(0, 86400),
    multiplier=st.floats(1, 10),
    jitter=st.floats(0, 1),
    failures=st.integers(1, 100_000),
    rand=st.floats(0, 1),
)
def test_backoff_is_bounded(
    initial: float, spread: float, multiplier: float, jitter: float, failures: int, rand: float
) -> None:
    backoff = RetryBackoff(
        initial_seconds=initial,
        max_seconds=min(86400, initial + spread),
        multiplier=multiplier,
        jitter=jitter,
    )
    delay = backoff.delay_seconds(failures, rand=rand)
    assert (1 - jitter) * min(backoff.max_seconds, initial) - 1e-9 <= delay
    assert delay <= backoff.max_seconds


# --- condition reasons -------------------------------------------------------------


def test_free_form_reasons_become_condition_reasons() -> None:
    assert condition_reason("out of memory") == "OutOfMemory"
    assert condition_reason("OOMKilled") == "OOMKilled"
    assert condition_reason("exit code: 137") == "ExitCode137"
    assert condition_reason("  ") == "Unknown"
    assert condition_reason("404 not found") == "NotFound"


@given(st.text())
def test_condition_reason_always_fits_the_api_servers_pattern(text: str) -> None:
    now = datetime.now(UTC)
    reason = condition_reason(text)
    Condition(
        type="Failed",
        status=ConditionStatus.TRUE,
        last_transition_time=now,
        reason=reason,
        message="",
    )
