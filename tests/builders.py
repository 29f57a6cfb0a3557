"""Fluent builders for AgentTask and AgentWorker manifests, instead of walls of YAML.

    task("t1").requires("gpu").cost(2).obj()
    worker("w1").capabilities("gpu", "cpu").weight(3).yaml()

Each builder method sets one field and returns the builder; ``obj()`` returns a
fresh dict and ``yaml()`` a manifest for ``kubectl apply -f -``. ``set(path,
value)`` and ``unset(path)`` reach any field (``"spec.retryBackoff.jitter"``) for
the deliberately wrong manifests the validation tests need.

``INVALID_TASKS`` / ``INVALID_WORKERS`` / ``INVALID_QUEUES`` / ``INVALID_BUDGETS`` are the
catalogue of manifests the API server must refuse, shared by the unit tests (the
pydantic models refuse them too) and the integration tests (the real API server
refuses them).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Self

import yaml

from agentq.models import API_VERSION

__all__ = [
    "INVALID_BUDGETS",
    "INVALID_QUEUES",
    "INVALID_TASKS",
    "INVALID_WORKERS",
    "BudgetBuilder",
    "Invalid",
    "QueueBuilder",
    "TaskBuilder",
    "WorkerBuilder",
    "budget",
    "queue",
    "task",
    "worker",
]


class _Builder:
    kind = ""

    def __init__(self, name: str) -> None:
        self._obj: dict[str, Any] = {
            "apiVersion": API_VERSION,
            "kind": self.kind,
            "metadata": {"name": name},
            "spec": {},
        }

    @property
    def _spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self._obj.setdefault("spec", {})
        return spec

    def namespace(self, namespace: str) -> Self:
        self._obj["metadata"]["namespace"] = namespace
        return self

    def label(self, key: str, value: str) -> Self:
        self._obj["metadata"].setdefault("labels", {})[key] = value
        return self

    def set(self, path: str, value: Any) -> Self:
        """Set any field by dotted path, creating objects on the way (no type checks)."""
        *parents, leaf = path.split(".")
        node = self._obj
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = copy.deepcopy(value)
        return self

    def unset(self, path: str) -> Self:
        """Remove a field by dotted path (a no-op if it is not there)."""
        *parents, leaf = path.split(".")
        node = self._obj
        for key in parents:
            node = node.get(key, {})
        node.pop(leaf, None)
        return self

    def obj(self) -> dict[str, Any]:
        """A fresh copy of the manifest as a dict."""
        return copy.deepcopy(self._obj)

    def yaml(self) -> str:
        """The manifest as YAML, for ``kubectl apply -f -``."""
        return yaml.safe_dump(self._obj, sort_keys=False)

    @property
    def name(self) -> str:
        name: str = self._obj["metadata"]["name"]
        return name


class TaskBuilder(_Builder):
    """An AgentTask manifest; only the fields you set are in it."""

    kind = "AgentTask"

    def requires(self, *capabilities: str) -> Self:
        self._spec["requiredCapabilities"] = list(capabilities)
        return self

    def cost(self, cost: float) -> Self:
        self._spec["cost"] = cost
        return self

    def payload(self, payload: Any) -> Self:
        self._spec["payload"] = copy.deepcopy(payload)
        return self

    def lease(self, seconds: int) -> Self:
        self._spec["leaseDurationSeconds"] = seconds
        return self

    def heartbeat(self, seconds: int) -> Self:
        self._spec["heartbeatIntervalSeconds"] = seconds
        return self

    def progress_deadline(self, seconds: int) -> Self:
        self._spec["progressDeadlineSeconds"] = seconds
        return self

    def max_reclaims(self, count: int) -> Self:
        self._spec["maxReclaims"] = count
        return self

    def on_expiry(self, policy: str, *, grace: int | None = None) -> Self:
        self._spec["onLeaseExpiry"] = policy
        if grace is not None:
            self._spec["gracePeriodSeconds"] = grace
        return self

    def cancel(self, cancel: bool = True) -> Self:
        return self.set("spec.cancel", cancel)

    def deadline(self, seconds: int) -> Self:
        return self.set("spec.activeDeadlineSeconds", seconds)

    def ttl(self, seconds: int) -> Self:
        return self.set("spec.ttlSecondsAfterFinished", seconds)

    def queue(self, name: str) -> Self:
        self._spec["queue"] = name
        return self

    def priority(self, priority: int) -> Self:
        return self.set("spec.priority", priority)

    def budget(self, name: str, *, tokens: int | None = None, requests: int | None = None) -> Self:
        """One more entry of spec.budgets (only the fields given: the rest defaulted)."""
        entry: dict[str, Any] = {"name": name}
        if tokens is not None:
            entry["tokens"] = tokens
        if requests is not None:
            entry["requests"] = requests
        self._spec.setdefault("budgets", []).append(entry)
        return self

    def grace(self, seconds: int) -> Self:
        self._spec["gracePeriodSeconds"] = seconds
        return self

    def backoff(
        self,
        *,
        initial: float | None = None,
        max: float | None = None,
        multiplier: float | None = None,
        jitter: float | None = None,
    ) -> Self:
        backoff = self._spec.setdefault("retryBackoff", {})
        for key, value in (
            ("initialSeconds", initial),
            ("maxSeconds", max),
            ("multiplier", multiplier),
            ("jitter", jitter),
        ):
            if value is not None:
                backoff[key] = value
        return self


class WorkerBuilder(_Builder):
    """An AgentWorker manifest; only the fields you set are in it."""

    kind = "AgentWorker"

    def capabilities(self, *capabilities: str) -> Self:
        self._spec["capabilities"] = list(capabilities)
        return self

    def weight(self, weight: float) -> Self:
        self._spec["weight"] = weight
        return self

    def max_in_flight(self, count: int) -> Self:
        self._spec["maxInFlight"] = count
        return self

    def paused(self, paused: bool = True) -> Self:
        self._spec["paused"] = paused
        return self


class QueueBuilder(_Builder):
    """An AgentQueue (cluster-scoped: no namespace)."""

    kind = "AgentQueue"

    def weight(self, weight: float) -> Self:
        self._spec["weight"] = weight
        return self

    def parent(self, name: str) -> Self:
        self._spec["parent"] = name
        return self

    def selects(self, **labels: str) -> Self:
        """namespaceSelector.matchLabels (none given: ``{}``, every namespace)."""
        self._spec["namespaceSelector"] = {"matchLabels": labels} if labels else {}
        return self

    def workers_in(self, namespace: str) -> Self:
        self._spec["workerNamespace"] = namespace
        return self

    def max_in_flight(self, count: int) -> Self:
        self._spec["maxInFlight"] = count
        return self


class BudgetBuilder(_Builder):
    """An AgentBudget (cluster-scoped: no namespace)."""

    kind = "AgentBudget"

    def requests_per_minute(self, limit: int) -> Self:
        return self.set("spec.requestsPerMinute", limit)

    def tokens_per_minute(self, limit: int) -> Self:
        return self.set("spec.tokensPerMinute", limit)

    def max_concurrent(self, limit: int) -> Self:
        return self.set("spec.maxConcurrent", limit)


def queue(name: str) -> QueueBuilder:
    return QueueBuilder(name)


def budget(name: str) -> BudgetBuilder:
    """An AgentBudget manifest named ``name`` (a valid one: every limit is optional)."""
    return BudgetBuilder(name)


def task(name: str) -> TaskBuilder:
    """An AgentTask manifest named ``name`` (a valid one: every spec field is optional)."""
    return TaskBuilder(name)


def worker(name: str, *capabilities: str) -> WorkerBuilder:
    """An AgentWorker manifest named ``name``; give it capabilities to make it valid."""
    builder = WorkerBuilder(name)
    if capabilities:
        builder.capabilities(*capabilities)
    return builder


@dataclass(frozen=True)
class Invalid:
    """A manifest the API server must refuse.

    ``field`` is the path the refusal must name (as the API server spells it);
    ``message`` a further fragment it must contain (for CEL rules, the rule's
    message, which the pydantic models raise too).
    """

    id: str
    builder: _Builder
    field: str
    message: str = ""
    # False where only the API server can tell: the models ignore unknown fields
    # (see agentq.models).
    model_refuses: bool = True

    def obj(self) -> dict[str, Any]:
        return self.builder.obj()


_HB = "heartbeatIntervalSeconds must be less than leaseDurationSeconds"
_PD = "progressDeadlineSeconds must be greater than the heartbeat interval"
_GP_REQUIRED = "gracePeriodSeconds is required when onLeaseExpiry is GracePeriod"
_GP_FORBIDDEN = "gracePeriodSeconds may only be set when onLeaseExpiry is GracePeriod"
_BACKOFF = "retryBackoff.maxSeconds must be at least retryBackoff.initialSeconds"
_NAME = "metadata.name must be at most 63 characters"
_WEIGHT = "weight must be at least 0.001"
_LONG_NAME = "x" * 64

INVALID_TASKS: tuple[Invalid, ...] = (
    Invalid("queue-not-a-name", task("t").queue("Team A"), "spec.queue"),
    Invalid("cost-wrong-type", task("t").set("spec.cost", "cheap"), "spec.cost", "number"),
    Invalid("cost-negative", task("t").cost(-1), "spec.cost"),
    Invalid("cost-zero", task("t").cost(0), "spec.cost"),
    Invalid("cost-too-big", task("t").cost(2_000_000), "spec.cost"),
    Invalid(
        "lease-wrong-type",
        task("t").set("spec.leaseDurationSeconds", "30s"),
        "spec.leaseDurationSeconds",
        "integer",
    ),
    Invalid(
        "lease-fractional",
        task("t").set("spec.leaseDurationSeconds", 2.5),
        "spec.leaseDurationSeconds",
    ),
    Invalid("lease-too-short", task("t").lease(2), "spec.leaseDurationSeconds"),
    Invalid("lease-too-long", task("t").lease(86401), "spec.leaseDurationSeconds"),
    Invalid("max-reclaims-negative", task("t").max_reclaims(-1), "spec.maxReclaims"),
    Invalid(
        "unknown-expiry-policy", task("t").on_expiry("Retry"), "spec.onLeaseExpiry", "Redispatch"
    ),
    Invalid(
        "heartbeat-equals-lease",
        task("t").lease(30).heartbeat(30),
        "spec.heartbeatIntervalSeconds",
        _HB,
    ),
    Invalid(
        "heartbeat-above-default-lease",
        task("t").heartbeat(45),
        "spec.heartbeatIntervalSeconds",
        _HB,
    ),
    Invalid(
        "progress-deadline-below-heartbeat",
        task("t").heartbeat(10).progress_deadline(10),
        "spec.progressDeadlineSeconds",
        _PD,
    ),
    Invalid(
        "progress-deadline-below-default-heartbeat",
        task("t").lease(30).progress_deadline(10),
        "spec.progressDeadlineSeconds",
        _PD,
    ),
    Invalid(
        "grace-period-missing",
        task("t").on_expiry("GracePeriod"),
        "spec.gracePeriodSeconds",
        _GP_REQUIRED,
    ),
    Invalid(
        "grace-period-without-policy", task("t").grace(10), "spec.gracePeriodSeconds", _GP_FORBIDDEN
    ),
    Invalid(
        "backoff-max-below-initial",
        task("t").backoff(initial=10, max=5),
        "spec.retryBackoff.maxSeconds",
        _BACKOFF,
    ),
    Invalid("backoff-jitter-above-one", task("t").backoff(jitter=1.5), "spec.retryBackoff.jitter"),
    Invalid(
        "backoff-multiplier-below-one",
        task("t").backoff(multiplier=0.5),
        "spec.retryBackoff.multiplier",
    ),
    Invalid("empty-capability", task("t").requires(""), "spec.requiredCapabilities[0]"),
    Invalid("uppercase-capability", task("t").requires("GPU"), "spec.requiredCapabilities[0]"),
    Invalid(
        "capability-not-a-string",
        task("t").set("spec.requiredCapabilities", [3]),
        "spec.requiredCapabilities[0]",
        "string",
    ),
    Invalid(
        "duplicate-capability", task("t").requires("gpu", "gpu"), "spec.requiredCapabilities[1]"
    ),
    Invalid(
        "too-many-capabilities",
        task("t").requires(*(f"c{i}" for i in range(17))),
        "spec.requiredCapabilities",
    ),
    Invalid("payload-not-an-object", task("t").payload(["a"]), "spec.payload", "object"),
    Invalid(
        "payload-too-many-keys",
        task("t").payload({f"k{i}": i for i in range(129)}),
        "spec.payload",
        "128",
    ),
    Invalid("cancel-not-a-boolean", task("t").set("spec.cancel", "yes"), "spec.cancel", "boolean"),
    Invalid("deadline-zero", task("t").deadline(0), "spec.activeDeadlineSeconds"),
    Invalid("deadline-negative", task("t").deadline(-5), "spec.activeDeadlineSeconds"),
    Invalid("deadline-huge", task("t").deadline(10**12), "spec.activeDeadlineSeconds"),
    Invalid(
        "deadline-not-an-integer",
        task("t").set("spec.activeDeadlineSeconds", 1.5),
        "spec.activeDeadlineSeconds",
    ),
    Invalid("ttl-negative", task("t").ttl(-1), "spec.ttlSecondsAfterFinished"),
    Invalid("ttl-huge", task("t").ttl(10**12), "spec.ttlSecondsAfterFinished"),
    Invalid("priority-too-high", task("t").priority(1001), "spec.priority"),
    Invalid("priority-too-low", task("t").priority(-1001), "spec.priority"),
    Invalid("priority-not-an-integer", task("t").set("spec.priority", 1.5), "spec.priority"),
    Invalid("budgets-not-a-list", task("t").set("spec.budgets", {"name": "a"}), "spec.budgets"),
    Invalid(
        "too-many-budgets",
        task("t").set("spec.budgets", [{"name": f"b{i}"} for i in range(9)]),
        "spec.budgets",
        "8",
    ),
    Invalid(
        "budget-named-twice",
        task("t").budget("openai").budget("openai", tokens=5),
        "spec.budgets[1]",
        "Duplicate value",
    ),
    Invalid("budget-without-name", task("t").set("spec.budgets", [{}]), "spec.budgets[0].name"),
    Invalid("budget-name-not-a-name", task("t").budget("Open AI"), "spec.budgets[0].name"),
    Invalid("budget-name-too-long", task("t").budget("b" * 64), "spec.budgets[0].name"),
    Invalid("budget-tokens-negative", task("t").budget("a", tokens=-1), "spec.budgets[0].tokens"),
    Invalid(
        "budget-tokens-too-big",
        task("t").budget("a", tokens=10**12 + 1),
        "spec.budgets[0].tokens",
    ),
    Invalid(
        "budget-tokens-fractional",
        task("t").set("spec.budgets", [{"name": "a", "tokens": 1.5}]),
        "spec.budgets[0].tokens",
    ),
    Invalid(
        "budget-requests-negative",
        task("t").budget("a", requests=-1),
        "spec.budgets[0].requests",
    ),
    Invalid(
        "budget-requests-too-big",
        task("t").budget("a", requests=10**9 + 1),
        "spec.budgets[0].requests",
    ),
    Invalid(
        "budget-requests-wrong-type",
        task("t").set("spec.budgets", [{"name": "a", "requests": "one"}]),
        "spec.budgets[0].requests",
        "integer",
    ),
    Invalid(
        "budget-unknown-field",
        task("t").set("spec.budgets", [{"name": "a", "cost": 3}]),
        "spec.budgets[0].cost",
        "unknown field",
        model_refuses=False,
    ),
    Invalid(
        "unknown-spec-field",
        task("t").set("spec.urgency", 5),
        "spec.urgency",
        "unknown field",
        model_refuses=False,
    ),
    Invalid(
        "unknown-nested-field",
        task("t").set("spec.retryBackoff.factor", 3),
        "spec.retryBackoff.factor",
        "unknown field",
        model_refuses=False,
    ),
    Invalid("name-too-long", task(_LONG_NAME), "metadata.name", _NAME),
)

INVALID_WORKERS: tuple[Invalid, ...] = (
    Invalid("no-spec", worker("w").unset("spec"), "spec", "Required"),
    Invalid("no-capabilities", worker("w").set("spec.weight", 1), "spec.capabilities", "Required"),
    Invalid("empty-capabilities", worker("w").capabilities(), "spec.capabilities"),
    Invalid("empty-capability-name", worker("w", ""), "spec.capabilities[0]"),
    Invalid("capability-with-space", worker("w", "g pu"), "spec.capabilities[0]"),
    Invalid("capability-too-long", worker("w", "c" * 64), "spec.capabilities[0]"),
    Invalid(
        "too-many-capabilities", worker("w", *(f"c{i}" for i in range(17))), "spec.capabilities"
    ),
    Invalid(
        "weight-wrong-type", worker("w", "gpu").set("spec.weight", "heavy"), "spec.weight", "number"
    ),
    Invalid("weight-zero", worker("w", "gpu").weight(0), "spec.weight", _WEIGHT),
    Invalid("weight-negative", worker("w", "gpu").weight(-2), "spec.weight"),
    Invalid("weight-denormal", worker("w", "gpu").weight(5e-324), "spec.weight"),
    Invalid("weight-below-minimum", worker("w", "gpu").weight(0.0009), "spec.weight", _WEIGHT),
    Invalid("max-in-flight-zero", worker("w", "gpu").max_in_flight(0), "spec.maxInFlight"),
    Invalid(
        "paused-wrong-type",
        worker("w", "gpu").set("spec.paused", "sometimes"),
        "spec.paused",
        "boolean",
    ),
    Invalid(
        "unknown-field",
        worker("w", "gpu").set("spec.gpus", 2),
        "spec.gpus",
        "unknown field",
        model_refuses=False,
    ),
    Invalid("name-too-long", worker(_LONG_NAME, "gpu"), "metadata.name", _NAME),
)

_OWN_PARENT = "a queue cannot be its own parent"
_SELECTOR_VALUES = "values must be non-empty for In and NotIn"

INVALID_QUEUES: tuple[Invalid, ...] = (
    Invalid("weight-zero", queue("q").weight(0), "spec.weight", _WEIGHT),
    Invalid("weight-too-big", queue("q").weight(1001), "spec.weight"),
    Invalid("weight-wrong-type", queue("q").set("spec.weight", "heavy"), "spec.weight", "number"),
    Invalid("own-parent", queue("q").parent("q"), "spec.parent", _OWN_PARENT),
    Invalid("parent-not-a-name", queue("q").parent("Team A"), "spec.parent"),
    Invalid("worker-namespace-not-a-label", queue("q").workers_in("a.b"), "spec.workerNamespace"),
    Invalid("max-in-flight-zero", queue("q").max_in_flight(0), "spec.maxInFlight"),
    Invalid(
        "selector-in-without-values",
        queue("q").set(
            "spec.namespaceSelector", {"matchExpressions": [{"key": "t", "operator": "In"}]}
        ),
        "spec.namespaceSelector.matchExpressions[0].values",
        _SELECTOR_VALUES,
    ),
    Invalid(
        "selector-exists-with-values",
        queue("q").set(
            "spec.namespaceSelector",
            {"matchExpressions": [{"key": "t", "operator": "Exists", "values": ["a"]}]},
        ),
        "spec.namespaceSelector.matchExpressions[0].values",
        _SELECTOR_VALUES,
    ),
    Invalid(
        "selector-unknown-operator",
        queue("q").set(
            "spec.namespaceSelector", {"matchExpressions": [{"key": "t", "operator": "Near"}]}
        ),
        "spec.namespaceSelector.matchExpressions[0].operator",
    ),
    Invalid(
        "selector-label-not-a-string",
        queue("q").set("spec.namespaceSelector", {"matchLabels": {"t": 3}}),
        "spec.namespaceSelector.matchLabels.t",
    ),
    Invalid(
        "unknown-field",
        queue("q").set("spec.quota", 2),
        "spec.quota",
        "unknown field",
        model_refuses=False,
    ),
    Invalid("name-too-long", queue(_LONG_NAME), "metadata.name", _NAME),
)

_BUDGET_NAME = "metadata.name must be at most 63 characters: tasks name it in spec.budgets"

INVALID_BUDGETS: tuple[Invalid, ...] = (
    Invalid("requests-zero", budget("b").requests_per_minute(0), "spec.requestsPerMinute"),
    Invalid("requests-negative", budget("b").requests_per_minute(-60), "spec.requestsPerMinute"),
    Invalid(
        "requests-fractional",
        budget("b").set("spec.requestsPerMinute", 0.5),
        "spec.requestsPerMinute",
    ),
    Invalid(
        "requests-wrong-type",
        budget("b").set("spec.requestsPerMinute", "fast"),
        "spec.requestsPerMinute",
        "integer",
    ),
    Invalid(
        "requests-too-many", budget("b").requests_per_minute(10**9 + 1), "spec.requestsPerMinute"
    ),
    Invalid("tokens-zero", budget("b").tokens_per_minute(0), "spec.tokensPerMinute"),
    Invalid("tokens-negative", budget("b").tokens_per_minute(-1), "spec.tokensPerMinute"),
    Invalid("tokens-too-many", budget("b").tokens_per_minute(10**12 + 1), "spec.tokensPerMinute"),
    Invalid("concurrent-zero", budget("b").max_concurrent(0), "spec.maxConcurrent"),
    Invalid("concurrent-negative", budget("b").max_concurrent(-2), "spec.maxConcurrent"),
    Invalid("concurrent-too-many", budget("b").max_concurrent(10**6 + 1), "spec.maxConcurrent"),
    Invalid(
        "unknown-field",
        budget("b").set("spec.burst", 10),
        "spec.burst",
        "unknown field",
        model_refuses=False,
    ),
    Invalid("name-too-long", budget(_LONG_NAME), "metadata.name", _BUDGET_NAME),
)
