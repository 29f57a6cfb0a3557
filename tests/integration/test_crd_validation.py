"""The CRDs in crds/ on the real kube-apiserver: what they refuse, what they fill in.

Every manifest of the invalid catalogue in tests/builders.py is sent with
``kubectl apply`` (strict field validation, kubectl's default) and must be
refused with a message naming the field; valid minimal manifests must come back
with the defaults the pydantic models also fill in; status written from the
models must be accepted through the status subresource; the printer columns,
short names and category must work as documented in docs/api.md.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml

from agentq.models import (
    AgentBudgetStatus,
    AgentTaskStatus,
    AgentWorkerStatus,
    AttemptOutcome,
    AttemptRecord,
    BudgetUsage,
    BudgetWindow,
    Condition,
    ConditionStatus,
    TaskPhase,
    WindowBucket,
    WorkerPhase,
    parse_budget,
    parse_queue,
    parse_task,
    parse_worker,
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

pytestmark = pytest.mark.integration

CRDS = Path(__file__).resolve().parents[2] / "crds"
CRD_NAMES = (
    "agenttasks.agentq.dev",
    "agentworkers.agentq.dev",
    "agentqueues.agentq.dev",
    "agentbudgets.agentq.dev",
)


class Kubectl(Protocol):
    """What this module needs of the ``control_plane`` fixture."""

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]: ...


class Cluster:
    """kubectl in one namespace of the control plane, with the CRDs installed."""

    def __init__(self, control_plane: Kubectl, namespace: str) -> None:
        self.cp = control_plane
        self.namespace = namespace

    def run(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.cp.kubectl("-n", self.namespace, *args, input=input, check=check)

    def apply(self, manifest: dict[str, Any], *extra: str, check: bool = True) -> str:
        done = self.run("apply", *extra, "-f", "-", input=yaml.safe_dump(manifest), check=check)
        return done.stdout + done.stderr

    def get(self, resource: str) -> dict[str, Any]:
        got: dict[str, Any] = json.loads(self.run("get", resource, "-o", "json").stdout)
        return got

    def exists(self, resource: str) -> bool:
        done = self.run("get", resource, "--ignore-not-found", "-o", "name", check=False)
        return bool(done.stdout.strip())

    def patch_status(self, resource: str, status: dict[str, Any], check: bool = True) -> str:
        done = self.run(
            "patch",
            resource,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": status}),
            "-o",
            "json",
            check=check,
        )
        return done.stdout + done.stderr


@pytest.fixture(scope="module")
def cluster(control_plane: Kubectl, agentq_crds: None) -> Iterator[Cluster]:
    """The CRDs applied (``agentq_crds``: once for all workers of a parallel run, as two
    applies at once can race to create them), in a fresh namespace."""
    namespace = f"crd-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", namespace)
    yield Cluster(control_plane, namespace)
    control_plane.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_the_crds_are_structural_and_established(cluster: Cluster) -> None:
    for name in CRD_NAMES:
        crd = json.loads(cluster.cp.kubectl("get", "crd", name, "-o", "json").stdout)
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions["Established"] == "True"
        assert conditions["NamesAccepted"] == "True"
        # The API server flags a non-structural schema (and drops pruning/defaulting).
        assert "NonStructuralSchema" not in conditions
        assert crd["status"]["acceptedNames"]["categories"] == ["agentq"]


def test_short_names_and_the_agentq_category(cluster: Cluster) -> None:
    cluster.apply(task("listed-task").obj())
    cluster.apply(worker("listed-worker", "gpu").obj())
    assert "agenttask.agentq.dev/listed-task" in cluster.run("get", "atask", "-o", "name").stdout
    assert (
        "agentworker.agentq.dev/listed-worker" in cluster.run("get", "aworker", "-o", "name").stdout
    )
    both = cluster.run("get", "agentq", "-o", "name").stdout.split()
    assert "agenttask.agentq.dev/listed-task" in both
    assert "agentworker.agentq.dev/listed-worker" in both


# --- refused ----------------------------------------------------------------------


def _refused(cluster: Cluster, case: Invalid, kind: str) -> None:
    manifest = case.obj()
    name = manifest["metadata"]["name"]
    done = cluster.run("apply", "-f", "-", input=yaml.safe_dump(manifest), check=False)
    output = done.stdout + done.stderr
    try:
        assert done.returncode != 0, f"{case.id} was accepted: {output}"
        assert case.field in output, f"the refusal does not name {case.field}: {output}"
        assert case.message in output, f"the refusal does not say {case.message!r}: {output}"
    finally:
        if cluster.exists(f"{kind}/{name}"):
            cluster.run("delete", f"{kind}/{name}", "--wait=false")
            pytest.fail(f"{case.id} was stored")


@pytest.mark.parametrize("case", INVALID_TASKS, ids=[c.id for c in INVALID_TASKS])
def test_invalid_task_is_refused(cluster: Cluster, case: Invalid) -> None:
    _refused(cluster, case, "agenttask")


@pytest.mark.parametrize("case", INVALID_WORKERS, ids=[c.id for c in INVALID_WORKERS])
def test_invalid_worker_is_refused(cluster: Cluster, case: Invalid) -> None:
    _refused(cluster, case, "agentworker")


@pytest.mark.parametrize("case", INVALID_QUEUES, ids=[c.id for c in INVALID_QUEUES])
def test_invalid_queue_is_refused(cluster: Cluster, case: Invalid) -> None:
    _refused(cluster, case, "agentqueue")


@pytest.mark.parametrize("case", INVALID_BUDGETS, ids=[c.id for c in INVALID_BUDGETS])
def test_invalid_budget_is_refused(cluster: Cluster, case: Invalid) -> None:
    _refused(cluster, case, "agentbudget")


def test_a_budget_is_cluster_scoped_with_its_columns_and_status(cluster: Cluster) -> None:
    name = f"{cluster.namespace}-b"
    limited = f"{cluster.namespace}-open"
    cluster.apply(
        budget(name).requests_per_minute(60).tokens_per_minute(6000).max_concurrent(2).obj()
    )
    cluster.apply(budget(limited).obj())  # no limit at all is valid
    try:
        read = cluster.get(f"agentbudget/{name}")
        assert "namespace" not in read["metadata"]
        assert read["spec"] == {
            "requestsPerMinute": 60,
            "tokensPerMinute": 6000,
            "maxConcurrent": 2,
        }
        assert parse_budget(read).spec.max_concurrent == 2
        assert cluster.get(f"agentbudget/{limited}")["spec"] == {}
        for listed in ("abudget", "agentq"):
            names = cluster.run("get", listed, "-o", "name").stdout.split()
            assert f"agentbudget.agentq.dev/{name}" in names, listed
        now = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
        status = AgentBudgetStatus(
            in_use=2,
            used_requests=40,
            used_tokens=5000,
            reserved_requests=1,
            reserved_tokens=1000,
            available_requests=19,
            available_tokens=0,
            available_concurrency=0,
            throttled_until=now,
            waiting=3,
            window=BudgetWindow(
                as_of=now,
                bucket_seconds=5,
                buckets=[WindowBucket(start=now, requests=40, tokens=5000)],
            ),
            conditions=[
                Condition(
                    type="Saturated",
                    status=ConditionStatus.TRUE,
                    last_transition_time=now,
                    reason="TokensPerMinute",
                    message="3 tasks wait for tokens",
                )
            ],
            observed_generation=1,
        )
        # Read back from the patch's own reply (an operator of the shared control plane
        # may write the status right after, once budgets are wired).
        reply = json.loads(cluster.patch_status(f"agentbudget/{name}", status.to_dict()) or "{}")
        assert parse_budget(reply).status == status
        header, row = _table(cluster.run("get", "abudget", name).stdout)
        assert header == [
            "NAME",
            "REQUESTS",
            "TOKENS",
            "MAXCONCURRENT",
            "INUSE",
            "WAITING",
            "THROTTLED",
            "AGE",
        ]
        assert row[:7] == [name, "60", "6000", "2", "2", "3", "2025-01-02T03:04:05Z"]
        header, row = _table(cluster.run("get", "abudget", name, "-o", "wide").stdout)
        assert header[7:11] == [
            "USEDREQUESTS",
            "USEDTOKENS",
            "AVAILABLEREQUESTS",
            "AVAILABLETOKENS",
        ]
        assert row[7:11] == ["40", "5000", "19", "0"]
        for bad, field in (
            ({"inUse": -1}, "status.inUse"),
            ({"throttledUntil": "soon"}, "status.throttledUntil"),
            ({"window": {"asOf": "2025-01-01T00:00:00Z", "bucketSeconds": 0}}, "status.window"),
            ({"window": {"asOf": None}}, "status.window.asOf"),  # a merge patch: null removes
        ):
            out = cluster.patch_status(f"agentbudget/{name}", bad, check=False)
            assert field in out, out
    finally:
        cluster.run("delete", f"agentbudget/{name}", f"agentbudget/{limited}", "--wait=false")


def test_a_queue_is_cluster_scoped_with_its_defaults_and_columns(cluster: Cluster) -> None:
    name = f"{cluster.namespace}-q"
    manifest = (
        queue(name)
        .selects(team="a")
        .workers_in(cluster.namespace)
        .set(
            "spec.namespaceSelector.matchExpressions",
            [{"key": "tier", "operator": "In", "values": ["gold"]}],
        )
        .obj()
    )
    cluster.apply(manifest)
    try:
        read = cluster.get(f"agentqueue/{name}")
        assert "namespace" not in read["metadata"]
        assert read["spec"]["weight"] == 1
        assert parse_queue(read).spec.admits({"team": "a", "tier": "gold"})
        assert f"agentqueue.agentq.dev/{name}" in cluster.run("get", "aqueue", "-o", "name").stdout
        assert f"agentqueue.agentq.dev/{name}" in cluster.run("get", "agentq", "-o", "name").stdout
        header, row = _table(cluster.run("get", "aqueue", name).stdout)
        assert header == ["NAME", "WEIGHT", "PARENT", "WORKERS", "PENDING", "INFLIGHT", "AGE"]
        # (an unset column prints empty: the row has no PARENT, PENDING, INFLIGHT yet)
        assert row[:3] == [name, "1", cluster.namespace]
        # Read back from the patch's own reply: an operator of the shared control plane
        # that watches every namespace may write the queue's status right after.
        reply = json.loads(
            cluster.patch_status(f"agentqueue/{name}", {"pending": 3, "share": 0.5}) or "{}"
        )
        assert {k: reply["status"].get(k) for k in ("pending", "share")} == {
            "pending": 3,
            "share": 0.5,
        }
        out = cluster.patch_status(f"agentqueue/{name}", {"share": 1.5}, check=False)
        assert "status.share" in out
    finally:
        cluster.run("delete", f"agentqueue/{name}", "--wait=false")


def test_unknown_fields_are_pruned_without_strict_validation(cluster: Cluster) -> None:
    # The documented gap: --validate=false (or a client sending no fieldValidation)
    # gets unknown fields silently dropped instead of refused.
    output = cluster.apply(task("lenient").set("spec.urgency", 5).obj(), "--validate=false")
    assert "created" in output
    assert "urgency" not in cluster.get("agenttask/lenient")["spec"]


def test_additional_properties_false_is_not_allowed_next_to_properties(cluster: Cluster) -> None:
    # Why the CRDs refuse unknown fields by pruning + strict field validation and
    # not by additionalProperties: false (docs/api.md).
    crd = yaml.safe_load((CRDS / "agentworkers.agentq.dev.yaml").read_text())
    crd["metadata"]["name"] = "strictworkers.agentq.dev"
    crd["spec"]["names"] = {"kind": "StrictWorker", "plural": "strictworkers"}
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec["additionalProperties"] = False
    done = cluster.cp.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(crd), check=False
    )
    assert done.returncode != 0
    assert "additionalProperties" in done.stderr


# --- accepted, with defaults --------------------------------------------------------


def test_a_minimal_task_gets_its_defaults(cluster: Cluster) -> None:
    cluster.apply(task("minimal").obj())
    cluster.apply(task("no-spec").unset("spec").obj())
    for name in ("minimal", "no-spec"):
        read = cluster.get(f"agenttask/{name}")
        assert read["spec"] == {
            "requiredCapabilities": [],
            "cost": 1,
            "leaseDurationSeconds": 30,
            "onLeaseExpiry": "Redispatch",
            "retryBackoff": {
                "initialSeconds": 1,
                "maxSeconds": 300,
                "multiplier": 2,
                "jitter": 0.2,
            },
            "cancel": False,
            "priority": 0,
        }
        assert parse_task(read).spec.to_dict() == read["spec"]


def test_a_minimal_worker_gets_its_defaults(cluster: Cluster) -> None:
    cluster.apply(worker("minimal", "gpu").obj())
    read = cluster.get("agentworker/minimal")
    assert read["spec"] == {"capabilities": ["gpu"], "weight": 1, "maxInFlight": 1, "paused": False}
    assert parse_worker(read).spec.to_dict() == read["spec"]


def test_a_full_task_is_stored_as_the_model_reads_it(cluster: Cluster) -> None:
    manifest = (
        task("full")
        .requires("gpu", "python-3-12")
        .cost(2.5)
        .payload({"prompt": "summarise", "files": ["a.md"], "options": {"depth": 2}})
        .lease(60)
        .heartbeat(10)
        .progress_deadline(120)
        .max_reclaims(3)
        .on_expiry("GracePeriod", grace=15)
        .backoff(initial=5, max=60, multiplier=3, jitter=0.5)
        .cancel(False)
        .deadline(3600)
        .ttl(0)
        .priority(-7)
        .obj()
    )
    cluster.apply(manifest)
    read = cluster.get("agenttask/full")
    assert read["spec"] == manifest["spec"]
    assert parse_task(read).spec.to_dict() == read["spec"]


@pytest.mark.parametrize(
    "builder",
    [
        task("edge-lease-min").lease(3).heartbeat(2),
        task("edge-heartbeat").lease(86400).heartbeat(86399),
        task("edge-deadline").lease(30).progress_deadline(11),
        task("edge-cost").cost(0.001).requires(*(f"c{i}" for i in range(16))),
        task("edge-backoff").backoff(initial=0, max=0, multiplier=1, jitter=1),
        task("edge-backoff-int").backoff(initial=7, max=7),
        task("edge-priority-max").priority(1000),
        task("edge-priority-min").priority(-1000),
        task("edge-hold").on_expiry("Hold").max_reclaims(0),
        task("edge-spans").deadline(31_536_000).ttl(31_536_000),
        task("edge-spans-min").deadline(1).ttl(0).cancel(),
        task("edge-budgets").set(
            "spec.budgets",
            [{"name": f"b{i}", "requests": 0, "tokens": 10**12} for i in range(7)]
            + [{"name": "a." + "b" * 61, "requests": 10**9}],
        ),
        task("x" * 63),
    ],
    ids=lambda b: b.name[:20],
)
def test_valid_edge_cases_are_accepted(cluster: Cluster, builder: Any) -> None:
    cluster.apply(builder.obj())
    assert cluster.exists(f"agenttask/{builder.name}")


# --- updates ----------------------------------------------------------------------


def test_required_capabilities_and_cost_are_immutable(cluster: Cluster) -> None:
    cluster.apply(task("fixed").requires("gpu").cost(2).obj())
    output = cluster.apply(task("fixed").requires("gpu", "cpu").cost(2).obj(), check=False)
    assert "spec.requiredCapabilities" in output
    assert "requiredCapabilities is immutable" in output
    output = cluster.apply(task("fixed").requires("gpu").cost(3).obj(), check=False)
    assert "spec.cost" in output
    assert "cost is immutable" in output
    # The lease settings may change; they apply from the next claim on.
    cluster.apply(task("fixed").requires("gpu").cost(2).lease(90).obj())
    assert cluster.get("agenttask/fixed")["spec"]["leaseDurationSeconds"] == 90


def test_payload_is_immutable_even_when_absent(cluster: Cluster) -> None:
    cluster.apply(task("with-input").payload({"prompt": "a"}).obj())
    cluster.apply(task("without-input").obj())
    for changed in (
        task("with-input").payload({"prompt": "b"}),
        task("with-input"),
        task("without-input").payload({"prompt": "late"}),
    ):
        output = cluster.apply(changed.obj(), check=False)
        assert "spec.payload" in output
        assert "payload is immutable" in output
    # Re-applying the same payload (in another key order) is no change.
    cluster.apply(task("with-input").payload({"prompt": "a"}).lease(60).obj())


def test_queue_is_immutable_even_when_absent(cluster: Cluster) -> None:
    cluster.apply(task("queued").queue("team-a").obj())
    cluster.apply(task("unqueued").obj())
    for changed in (
        task("queued").queue("team-b"),
        task("queued"),
        task("unqueued").queue("team-a"),
    ):
        output = cluster.apply(changed.obj(), check=False)
        assert "spec.queue" in output
        assert "queue is immutable" in output
    cluster.apply(task("queued").queue("team-a").priority(3).obj())


def test_budgets_are_immutable_even_when_absent(cluster: Cluster) -> None:
    cluster.apply(task("budgeted").budget("openai", tokens=800).budget("search").obj())
    cluster.apply(task("unbudgeted").obj())
    for changed in (
        task("budgeted").budget("openai", tokens=900).budget("search"),
        task("budgeted").budget("openai", tokens=800),
        task("budgeted"),
        task("unbudgeted").budget("openai"),
    ):
        output = cluster.apply(changed.obj(), check=False)
        assert "spec.budgets" in output
        assert "budgets is immutable" in output
    # The same entries in another order, or with a default spelled out, are no change.
    cluster.apply(task("budgeted").budget("search", requests=1).budget("openai", tokens=800).obj())
    read = cluster.get("agenttask/budgeted")["spec"]["budgets"]
    assert sorted(read, key=lambda b: b["name"]) == [
        {"name": "openai", "requests": 1, "tokens": 800},
        {"name": "search", "requests": 1, "tokens": 0},
    ]


def test_cel_rules_apply_to_updates_too(cluster: Cluster) -> None:
    cluster.apply(task("later").lease(30).heartbeat(10).obj())
    output = cluster.apply(task("later").lease(9).heartbeat(10).obj(), check=False)
    assert "spec.heartbeatIntervalSeconds" in output
    assert "heartbeatIntervalSeconds must be less than leaseDurationSeconds" in output


# --- status -----------------------------------------------------------------------


def test_status_is_a_subresource(cluster: Cluster) -> None:
    cluster.apply(task("sneaky").set("status.phase", "Succeeded").obj())
    # The status written with the object is dropped; what is left is the CRD's default.
    assert cluster.get("agenttask/sneaky").get("status", {}) == {"phase": "Pending"}


def test_status_written_from_the_models_is_accepted(cluster: Cluster) -> None:
    now = datetime.now(UTC)
    cluster.apply(task("reported").requires("gpu").obj())
    status = AgentTaskStatus(
        phase=TaskPhase.RUNNING,
        worker="w1",
        attempt=2,
        reclaims=1,
        fencing_token=2,
        lease_name="agentq-task-reported",
        progress="step 3 of 10",
        grace_until=now,
        result_ref="file:///tmp/result.json",
        requeue_handled="20250101T000000Z-0123abcd",
        assigned_at=now,
        started_at=now,
        last_transition_time=now,
        result={"partial": [1, 2]},
        history=[
            AttemptRecord(
                worker="w0",
                token=1,
                attempt=1,
                outcome=AttemptOutcome.FAILED,
                reason="LeaseExpired",
                time=now,
            ),
            AttemptRecord(
                worker="w1",
                token=2,
                attempt=2,
                outcome=AttemptOutcome.FAILED,
                reason="LeaseExpired",
                time=now,
                usage=[
                    BudgetUsage(name="openai", requests=3, tokens=2900),
                    BudgetUsage(name="search", requests=1, tokens=0),
                ],
            ),
            AttemptRecord(outcome=AttemptOutcome.REQUEUED, reason="Requeued", time=now),
        ],
        refused_reports=1,
        conditions=[
            Condition(
                type="Assigned",
                status=ConditionStatus.TRUE,
                last_transition_time=now,
                reason="Dispatched",
                message="assigned to w1",
            )
        ],
        observed_generation=1,
    )
    cluster.patch_status("agenttask/reported", status.to_dict())
    read = parse_task(cluster.get("agenttask/reported"))
    assert read.status.phase is TaskPhase.RUNNING
    assert read.status.history == status.history
    assert read.status.result == {"partial": [1, 2]}

    cluster.apply(worker("busy", "gpu").weight(2).obj())
    worker_status = AgentWorkerStatus(
        phase=WorkerPhase.READY,
        in_flight=1,
        in_flight_cost=1.5,
        served_cost=10.5,
        deficit=-0.5,
        assigned_tasks=frozenset({"reported"}),
    )
    cluster.patch_status("agentworker/busy", worker_status.to_dict())
    assert parse_worker(cluster.get("agentworker/busy")).status == worker_status


def _attempt(n: int, **fields: Any) -> dict[str, Any]:
    record = {"worker": "w", "token": n, "attempt": n, "outcome": "Failed"}
    return {**record, "time": "2025-01-01T00:00:00Z", **fields}


INVALID_STATUSES = {
    "unknown-phase": ({"phase": "Exploded"}, "status.phase"),
    "negative-attempt": ({"attempt": -1}, "status.attempt"),
    "bad-timestamp": ({"assignedAt": "yesterday"}, "status.assignedAt"),
    "unknown-outcome": (
        {"history": [_attempt(1, outcome="Vanished")]},
        "status.history[0].outcome",
    ),
    "history-without-time": ({"history": [_attempt(1, time=None)]}, "status.history[0].time"),
    "history-too-long": ({"history": [_attempt(n) for n in range(1, 22)]}, "status.history"),
    "usage-negative": (
        {"history": [_attempt(1, usage=[{"name": "openai", "tokens": -1}])]},
        "status.history[0].usage[0].tokens",
    ),
    "usage-repeated": (
        {"history": [_attempt(1, usage=[{"name": "openai"}, {"name": "openai"}])]},
        "status.history[0].usage[1]",
    ),
}


@pytest.mark.parametrize(
    ("status", "field"), INVALID_STATUSES.values(), ids=INVALID_STATUSES.keys()
)
def test_invalid_status_is_refused(cluster: Cluster, status: dict[str, Any], field: str) -> None:
    cluster.apply(task("victim").obj())
    done = cluster.run(
        "patch",
        "agenttask/victim",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
        check=False,
    )
    assert done.returncode != 0
    assert field in done.stderr


# --- printer columns ------------------------------------------------------------------


def _table(output: str) -> list[list[str]]:
    return [line.split() for line in output.strip().splitlines()]


def test_task_printer_columns(cluster: Cluster) -> None:
    cluster.apply(task("shown").requires("gpu").cost(3).queue("team-a").obj())
    cluster.patch_status(
        "agenttask/shown",
        AgentTaskStatus(
            phase=TaskPhase.ASSIGNED, worker="w7", attempt=2, reclaims=1, fencing_token=5
        ).to_dict(),
    )
    header, row = _table(cluster.run("get", "atask", "shown").stdout)
    assert header == ["NAME", "PHASE", "WORKER", "ATTEMPT", "RECLAIMS", "COST", "AGE"]
    assert row[:6] == ["shown", "Assigned", "w7", "2", "1", "3"]
    header, row = _table(cluster.run("get", "atask", "shown", "-o", "wide").stdout)
    assert header == [
        "NAME",
        "PHASE",
        "WORKER",
        "ATTEMPT",
        "RECLAIMS",
        "COST",
        "PRIORITY",
        "QUEUE",
        "TOKEN",
        "REQUIRES",
        "REASON",
        "AGE",
    ]
    assert row[:10] == ["shown", "Assigned", "w7", "2", "1", "3", "0", "team-a", "5", '["gpu"]']


def test_worker_printer_columns(cluster: Cluster) -> None:
    cluster.apply(worker("shown", "gpu", "cpu").weight(2.5).max_in_flight(4).obj())
    cluster.patch_status(
        "agentworker/shown", AgentWorkerStatus(phase=WorkerPhase.READY, in_flight=3).to_dict()
    )
    header, row = _table(cluster.run("get", "aworker", "shown").stdout)
    assert header == ["NAME", "PHASE", "WEIGHT", "INFLIGHT", "CAPABILITIES", "AGE"]
    assert row[:5] == ["shown", "Ready", "2.5", "3", '["gpu","cpu"]']
    header, row = _table(cluster.run("get", "aworker", "shown", "-o", "wide").stdout)
    assert header == [
        "NAME",
        "PHASE",
        "WEIGHT",
        "INFLIGHT",
        "MAX",
        "CAPABILITIES",
        "PAUSED",
        "SERVED",
        "DEFICIT",
        "AGE",
    ]
    assert row[:7] == ["shown", "Ready", "2.5", "3", "4", '["gpu","cpu"]', "false"]


def test_kubectl_get_agentq_lists_both_kinds_with_their_columns(cluster: Cluster) -> None:
    cluster.apply(task("in-category").obj())
    cluster.apply(worker("in-category", "gpu").obj())
    output = cluster.run("get", "agentq").stdout
    assert "agenttask.agentq.dev/in-category" in output
    assert "agentworker.agentq.dev/in-category" in output
    assert "RECLAIMS" in output
    assert "CAPABILITIES" in output
