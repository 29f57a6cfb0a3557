"""The AgentTask, AgentWorker, AgentQueue and AgentBudget API (``agentq.dev/v1alpha1``) as
pydantic models.

This module owns the Python view of the custom resources. It mirrors
``crds/agenttasks.agentq.dev.yaml``, ``crds/agentworkers.agentq.dev.yaml``,
``crds/agentqueues.agentq.dev.yaml`` and ``crds/agentbudgets.agentq.dev.yaml``
field for field: the same camelCase names (as
aliases of snake_case attributes), defaults, bounds, enums and patterns, and one
check per CEL rule with the same message. ``tests/unit/test_crd_models.py`` fails
when the two drift apart;
``docs/api.md`` is the reference for users.

It does no I/O and imports neither kopf nor kubernetes, so the scheduling core,
the CLI and the tests can all use it. Entry points:

- ``parse_task(body)`` / ``parse_worker(body)`` / ``parse_queue(body)`` /
  ``parse_budget(body)``: a whole object (a dict from the API server or a kopf
  ``Body``) to ``AgentTask`` / ``AgentWorker`` / ``AgentQueue`` / ``AgentBudget``;
- ``parse_task_spec``, ``parse_task_status``, ``parse_worker_spec``,
  ``parse_worker_status``: one part (kopf's ``spec`` / ``status`` kwargs);
- ``Model.to_dict()``: back to the JSON the API server expects (camelCase,
  unset optional fields left out), e.g. for a status replace;
- ``Model.to_patch()``: a JSON merge patch of the fields given explicitly
  (``None`` clears a field), e.g. for a status patch.

Unknown fields are ignored when parsing, as Kubernetes clients do: the API
server already refuses them on user input (strict field validation) and prunes
them from storage, so an unknown field here can only come from a newer CRD than
this code, which must not stop an older operator during an upgrade.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal, Self, TypeVar

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PlainSerializer,
    Strict,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel, to_snake

from agentq import GROUP, VERSION

__all__ = [
    "ACTIVE_PHASES",
    "API_VERSION",
    "BUDGET_PLURAL",
    "CAPABILITY_PATTERN",
    "DEFAULT_LEASE_DURATION_SECONDS",
    "FINAL_PHASES",
    "MAX_BUDGETS",
    "MAX_BUDGET_REQUESTS",
    "MAX_BUDGET_TOKENS",
    "MAX_CAPABILITIES",
    "MAX_HISTORY",
    "MAX_NAME_LENGTH",
    "MAX_PAYLOAD_KEYS",
    "MAX_SPAN_SECONDS",
    "MAX_TOKEN",
    "MIN_WEIGHT",
    "QUEUE_NAME_PATTERN",
    "QUEUE_PLURAL",
    "REQUEUABLE_PHASES",
    "TASK_PLURAL",
    "WORKER_PLURAL",
    "AgentBudget",
    "AgentBudgetSpec",
    "AgentBudgetStatus",
    "AgentQueue",
    "AgentQueueSpec",
    "AgentQueueStatus",
    "AgentTask",
    "AgentTaskSpec",
    "AgentTaskStatus",
    "AgentWorker",
    "AgentWorkerSpec",
    "AgentWorkerStatus",
    "AttemptOutcome",
    "AttemptRecord",
    "BudgetEstimate",
    "BudgetUsage",
    "BudgetWindow",
    "Condition",
    "ConditionStatus",
    "LabelSelector",
    "LabelSelectorRequirement",
    "LeaseExpiryPolicy",
    "ModelError",
    "ObjectMeta",
    "RetryBackoff",
    "SelectorOperator",
    "TaskError",
    "TaskPhase",
    "WindowBucket",
    "WorkerPhase",
    "condition_reason",
    "parse_budget",
    "parse_queue",
    "parse_task",
    "parse_task_spec",
    "parse_task_status",
    "parse_worker",
    "parse_worker_spec",
    "parse_worker_status",
    "to_plain",
]

API_VERSION = f"{GROUP}/{VERSION}"
TASK_PLURAL = "agenttasks"
WORKER_PLURAL = "agentworkers"
QUEUE_PLURAL = "agentqueues"
BUDGET_PLURAL = "agentbudgets"

# A capability is a short lowercase name (a DNS label): "gpu", "python-3-12".
CAPABILITY_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
MAX_CAPABILITIES = 16
# An AgentQueue's name as a task's spec.queue or a queue's spec.parent names it: an
# object name short enough to be a label value (agentq.dev/queue).
QUEUE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
# Object names become label values (agentq.dev/task, agentq.dev/worker): 63 at most.
MAX_NAME_LENGTH = 63
MAX_HISTORY = 20
DEFAULT_LEASE_DURATION_SECONDS = 30
# The least worker weight: the scheduler divides by it, and a denormal weight would
# make a normalized load infinite.
MIN_WEIGHT = 0.001
# Top-level keys of a task's payload (the CRD's maxProperties; deeper limits cannot
# be expressed in a CRD schema and are the operator's, see agentq.protocol).
MAX_PAYLOAD_KEYS = 128
# Fencing tokens in a status: at most 2^53-1, an integer every JSON reader keeps exact.
MAX_TOKEN = 2**53 - 1
# activeDeadlineSeconds and ttlSecondsAfterFinished: at most a year.
MAX_SPAN_SECONDS = 31_536_000
#: ``spec.priority`` ranges over [-MAX_PRIORITY, MAX_PRIORITY] (the CRD says the same).
MAX_PRIORITY = 1000
#: A task names at most this many AgentBudgets (``spec.budgets``).
MAX_BUDGETS = 8
#: The largest requests / tokens an estimate, a report or a per-minute limit may hold.
MAX_BUDGET_REQUESTS = 1_000_000_000
MAX_BUDGET_TOKENS = 1_000_000_000_000
#: The largest ``maxConcurrent`` of an AgentBudget.
MAX_CONCURRENT = 1_000_000

# metav1.Condition's own validation, as in every generated CRD.
_CONDITION_TYPE_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
)
_CONDITION_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


class ModelError(ValueError):
    """A Kubernetes object (or part of one) that does not fit the agentq schema."""


# --- enums -----------------------------------------------------------------------


class TaskPhase(StrEnum):
    """``AgentTask.status.phase``."""

    PENDING = "Pending"
    ASSIGNED = "Assigned"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    DEAD_LETTERED = "DeadLettered"
    HELD = "Held"
    CANCELLED = "Cancelled"

    @property
    def is_final(self) -> bool:
        """Succeeded, Failed, DeadLettered and Cancelled never change again (short of a
        requeue)."""
        return self in FINAL_PHASES

    @property
    def is_active(self) -> bool:
        """Assigned or Running: a worker holds a claim (a Lease) on the task."""
        return self in ACTIVE_PHASES


# The phase sets the operator and the CLI decide by, defined once.
#: A worker holds a claim on the task (it has a Lease and counts as load).
ACTIVE_PHASES: frozenset[TaskPhase] = frozenset({TaskPhase.ASSIGNED, TaskPhase.RUNNING})
#: Never change again short of `agentq requeue`.
FINAL_PHASES: frozenset[TaskPhase] = frozenset(
    {TaskPhase.SUCCEEDED, TaskPhase.FAILED, TaskPhase.DEAD_LETTERED, TaskPhase.CANCELLED}
)
#: What `agentq requeue` may redrive.
REQUEUABLE_PHASES: frozenset[TaskPhase] = frozenset(
    {TaskPhase.HELD, TaskPhase.DEAD_LETTERED, TaskPhase.FAILED, TaskPhase.CANCELLED}
)


class WorkerPhase(StrEnum):
    """``AgentWorker.status.phase``."""

    READY = "Ready"
    NOT_READY = "NotReady"
    DRAINING = "Draining"


class LeaseExpiryPolicy(StrEnum):
    """``AgentTask.spec.onLeaseExpiry``."""

    REDISPATCH = "Redispatch"
    GRACE_PERIOD = "GracePeriod"
    HOLD = "Hold"


class AttemptOutcome(StrEnum):
    """An entry of ``AgentTask.status.history``: how an attempt ended, or a requeue.

    Failed covers every failed attempt (reported failure, expired lease, progress
    deadline exceeded); the entry's ``reason`` says which.
    """

    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    HELD = "Held"
    REQUEUED = "Requeued"
    CANCELLED = "Cancelled"


class SelectorOperator(StrEnum):
    """``LabelSelectorRequirement.operator``."""

    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class ConditionStatus(StrEnum):
    """``metav1.Condition.status``."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


# --- field types -----------------------------------------------------------------


def _refuse_duplicates(data: Any, field: str) -> None:
    # The API server refuses duplicates in a list-type=set; a frozenset would
    # silently merge them, so refuse them here too.
    if not isinstance(data, Mapping):
        return
    value = data.get(field, data.get(to_snake(field)))
    if isinstance(value, list | tuple):
        seen: set[Any] = set()
        for item in value:
            if not isinstance(item, str):
                continue  # not a capability at all: the field's own type check says so
            if item in seen:
                raise ValueError(f"{field} must not repeat {item!r}")
            seen.add(item)


# Numbers and booleans of a spec are taken as the JSON types the CRD declares, as the API
# server takes them: "1.5" is not a number, "true" not a boolean, false not 0 (an
# integer is a number, though).
JsonInt = Annotated[int, Strict()]
JsonFloat = Annotated[float, Strict()]
JsonBool = Annotated[bool, Strict()]

Capability = Annotated[
    str, StringConstraints(min_length=1, max_length=63, pattern=CAPABILITY_PATTERN)
]
# A set on the Python side (subset checks), a sorted list on the wire (stable output).
CapabilitySet = Annotated[
    frozenset[Capability],
    PlainSerializer(sorted, return_type=list[str]),
]
ObjectName = Annotated[str, StringConstraints(max_length=MAX_NAME_LENGTH)]
QueueName = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_NAME_LENGTH, pattern=QUEUE_NAME_PATTERN)
]
NameSet = Annotated[frozenset[ObjectName], PlainSerializer(sorted, return_type=list[str])]
# A worker's assignedTasks: a task of its namespace by name, another's as <namespace>/<task>.
TaskRefSet = Annotated[
    frozenset[Annotated[str, StringConstraints(max_length=2 * MAX_NAME_LENGTH + 1)]],
    PlainSerializer(sorted, return_type=list[str]),
]
# An AgentBudget's name as a task's spec.budgets names it (as an AgentQueue's).
BudgetName = QueueName


def _refuse_repeated_names(items: Sequence[Any] | None, field: str) -> None:
    # A list-type=map keyed by name: the API server refuses a repeated key.
    seen: set[str] = set()
    for item in items or ():
        if item.name in seen:
            raise ValueError(f"{field} must not repeat {item.name!r}")
        seen.add(item.name)


# --- bases -----------------------------------------------------------------------


class _Model(BaseModel):
    """Base of the spec-side models: camelCase on the wire, immutable once parsed."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="ignore",
        frozen=True,
    )

    def to_dict(self) -> dict[str, Any]:
        """The object as the API server's JSON: camelCase keys, unset (None) fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def to_patch(self) -> dict[str, Any]:
        """A JSON merge patch of the fields given explicitly, ``None`` as ``null``.

        ``AgentTaskStatus(phase=TaskPhase.PENDING, worker=None).to_patch()`` is
        ``{"phase": "Pending", "worker": None}``: sets the phase, removes the
        worker, leaves every other field alone.
        """
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


class _StatusModel(_Model):
    """Base of the status models: the operator builds and updates them, checked on assignment."""

    model_config = ConfigDict(frozen=False, validate_assignment=True)


# --- AgentWorker -----------------------------------------------------------------


class AgentWorkerSpec(_Model):
    """``AgentWorker.spec``: what the worker can do and how much of the queue it takes."""

    capabilities: CapabilitySet = Field(min_length=1, max_length=MAX_CAPABILITIES)
    # `minimum` for the schema; the check is the validator below (the CRD rule's message).
    weight: JsonFloat = Field(default=1.0, le=1000, json_schema_extra={"minimum": MIN_WEIGHT})
    max_in_flight: JsonInt = Field(default=1, ge=1, le=1000)
    paused: JsonBool = False

    @model_validator(mode="before")
    @classmethod
    def _no_duplicate_capabilities(cls, data: Any) -> Any:
        _refuse_duplicates(data, "capabilities")
        return data

    @field_validator("weight")
    @classmethod
    def _weight_at_least_minimum(cls, weight: float) -> float:
        # The CRD's CEL rule, same message (its `minimum` alone lets an integer 0 through).
        if not weight >= MIN_WEIGHT:
            raise ValueError("weight must be at least 0.001")
        return weight

    def covers(self, required: frozenset[str]) -> bool:
        """Whether this worker offers every capability in ``required``."""
        return required <= self.capabilities


class Condition(_StatusModel):
    """A standard ``metav1.Condition``."""

    type: Annotated[str, StringConstraints(max_length=316, pattern=_CONDITION_TYPE_PATTERN)]
    status: ConditionStatus
    observed_generation: int | None = Field(default=None, ge=0)
    last_transition_time: AwareDatetime
    reason: Annotated[
        str, StringConstraints(min_length=1, max_length=1024, pattern=_CONDITION_REASON_PATTERN)
    ]
    message: Annotated[str, StringConstraints(max_length=32768)]


Conditions = Annotated[list[Condition], Field(max_length=16)]

_NOT_A_REASON_CHAR = re.compile(r"[^A-Za-z0-9_]+")


def condition_reason(text: str, *, fallback: str = "Unknown") -> str:
    """``text`` made a valid ``Condition.reason`` (a CamelCase word).

    The API server refuses a condition whose reason does not match
    ``^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$``, and with it the whole status
    write; agents report free-form reasons ("out of memory"), so pass those
    through here first: ``"out of memory" -> "OutOfMemory"``.
    """
    words = (w for w in _NOT_A_REASON_CHAR.split(text) if w)
    reason = "".join(w[:1].upper() + w[1:] for w in words).lstrip("0123456789_")
    return reason[:1024] or fallback


class AgentWorkerStatus(_StatusModel):
    """``AgentWorker.status``, written by the operator only."""

    phase: WorkerPhase | None = None
    in_flight: int | None = Field(default=None, ge=0)
    in_flight_cost: float | None = Field(default=None, ge=0)
    served_cost: float | None = Field(default=None, ge=0)
    deficit: float | None = None
    assigned_tasks: TaskRefSet | None = Field(default=None, max_length=1000)
    conditions: Conditions | None = None
    observed_generation: int | None = Field(default=None, ge=0)


# --- AgentTask -------------------------------------------------------------------


class RetryBackoff(_Model):
    """``AgentTask.spec.retryBackoff``: the delay between a failed attempt and the next."""

    initial_seconds: JsonFloat = Field(default=1.0, ge=0, le=86400)
    max_seconds: JsonFloat = Field(default=300.0, ge=0, le=86400)
    multiplier: JsonFloat = Field(default=2.0, ge=1, le=10)
    jitter: JsonFloat = Field(default=0.2, ge=0, le=1)

    @model_validator(mode="after")
    def _max_not_below_initial(self) -> Self:
        if self.max_seconds < self.initial_seconds:
            raise ValueError("retryBackoff.maxSeconds must be at least retryBackoff.initialSeconds")
        return self

    def delay_seconds(self, failures: int, *, rand: float) -> float:
        """The delay after the ``failures``-th consecutive failed attempt (from 1).

        ``min(maxSeconds, initialSeconds * multiplier ** (failures - 1))``, less
        ``jitter * rand`` of it; ``rand`` is a uniform draw from [0, 1), injected so
        callers (and tests) own the randomness. Never exceeds ``max_seconds``.
        """
        if failures < 1:
            return 0.0
        if not 0.0 <= rand <= 1.0:
            raise ValueError(f"rand must be in [0, 1], not {rand}")
        try:
            base = self.initial_seconds * self.multiplier ** (failures - 1)
        except OverflowError:
            base = math.inf
        base = min(self.max_seconds, base)
        return base * (1.0 - self.jitter * rand)


class BudgetEstimate(_Model):
    """One entry of ``AgentTask.spec.budgets``: an AgentBudget an attempt spends, and how
    much one attempt is expected to spend of it (docs/budgets.md)."""

    name: BudgetName
    requests: JsonInt = Field(default=1, ge=0, le=MAX_BUDGET_REQUESTS)
    tokens: JsonInt = Field(default=0, ge=0, le=MAX_BUDGET_TOKENS)


class AgentTaskSpec(_Model):
    """``AgentTask.spec``: what the task needs and how its claims are leased."""

    required_capabilities: CapabilitySet = Field(default=frozenset(), max_length=MAX_CAPABILITIES)
    cost: JsonFloat = Field(default=1.0, gt=0, le=1_000_000)
    payload: dict[str, JsonValue] | None = Field(default=None, max_length=MAX_PAYLOAD_KEYS)
    lease_duration_seconds: JsonInt = Field(default=DEFAULT_LEASE_DURATION_SECONDS, ge=3, le=86400)
    heartbeat_interval_seconds: JsonInt | None = Field(default=None, ge=1, le=86399)
    progress_deadline_seconds: JsonInt | None = Field(default=None, ge=1, le=604800)
    max_reclaims: JsonInt | None = Field(default=None, ge=0, le=1000)
    on_lease_expiry: LeaseExpiryPolicy = LeaseExpiryPolicy.REDISPATCH
    grace_period_seconds: JsonInt | None = Field(default=None, ge=1, le=86400)
    retry_backoff: RetryBackoff = RetryBackoff()
    # Ends the task Cancelled; a running attempt's claim is revoked first (its agent told).
    cancel: JsonBool = False
    # Wall time from the first grant, across every attempt; then Failed, DeadlineExceeded.
    active_deadline_seconds: JsonInt | None = Field(default=None, ge=1, le=MAX_SPAN_SECONDS)
    # A finished task (and its Leases) is deleted this long after it finished (0: at once);
    # unset: the operator's TTL_AFTER_FINISHED.
    ttl_seconds_after_finished: JsonInt | None = Field(default=None, ge=0, le=MAX_SPAN_SECONDS)
    # Order in the pending queue: higher first, oldest first within a priority.
    priority: JsonInt = Field(default=0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    # The AgentQueue (cluster-scoped) the task is queued in; None: its namespace's own.
    queue: QueueName | None = None
    # The AgentBudgets (cluster-scoped) an attempt spends, with its estimates; a tuple:
    # immutable, as the spec is.
    budgets: tuple[BudgetEstimate, ...] | None = Field(default=None, max_length=MAX_BUDGETS)

    @model_validator(mode="before")
    @classmethod
    def _no_duplicate_capabilities(cls, data: Any) -> Any:
        _refuse_duplicates(data, "requiredCapabilities")
        return data

    @model_validator(mode="after")
    def _cross_field_rules(self) -> Self:
        _refuse_repeated_names(self.budgets, "budgets")
        # One check per CEL rule of the CRD, with the same message.
        hb = self.heartbeat_interval_seconds
        if hb is not None and hb >= self.lease_duration_seconds:
            raise ValueError("heartbeatIntervalSeconds must be less than leaseDurationSeconds")
        deadline = self.progress_deadline_seconds
        # Integer arithmetic, as in the CEL rule: deadline > lease / 3 <=> 3 * deadline > lease.
        if deadline is not None and not (
            deadline > hb if hb is not None else deadline * 3 > self.lease_duration_seconds
        ):
            raise ValueError(
                "progressDeadlineSeconds must be greater than the heartbeat interval "
                "(heartbeatIntervalSeconds, by default leaseDurationSeconds / 3): "
                "progress arrives with heartbeats"
            )
        grace = self.on_lease_expiry is LeaseExpiryPolicy.GRACE_PERIOD
        if grace and self.grace_period_seconds is None:
            raise ValueError("gracePeriodSeconds is required when onLeaseExpiry is GracePeriod")
        if not grace and self.grace_period_seconds is not None:
            raise ValueError("gracePeriodSeconds may only be set when onLeaseExpiry is GracePeriod")
        return self

    @property
    def effective_heartbeat_interval_seconds(self) -> float:
        """``heartbeatIntervalSeconds``, or a third of the lease duration when unset."""
        if self.heartbeat_interval_seconds is not None:
            return float(self.heartbeat_interval_seconds)
        return self.lease_duration_seconds / 3

    def effective_max_reclaims(self, default: int) -> int:
        """``maxReclaims``, or the operator's ``default`` (MAX_RECLAIMS) when unset."""
        return default if self.max_reclaims is None else self.max_reclaims


class TaskError(_StatusModel):
    """``AgentTask.status.error``: the last reported failure."""

    reason: Annotated[str, StringConstraints(max_length=1024)] | None = None
    message: Annotated[str, StringConstraints(max_length=32768)] | None = None
    retryable: bool | None = None


class BudgetUsage(_StatusModel):
    """One entry of ``AgentTask.status.history[].usage``: what an ended attempt was
    accounted on one budget (docs/budgets.md)."""

    name: BudgetName
    requests: int | None = Field(default=None, ge=0, le=MAX_BUDGET_REQUESTS)
    tokens: int | None = Field(default=None, ge=0, le=MAX_BUDGET_TOKENS)


class AttemptRecord(_StatusModel):
    """One entry of ``AgentTask.status.history``: the end of an attempt, or a requeue."""

    worker: ObjectName | None = None
    token: int | None = Field(default=None, ge=0, le=MAX_TOKEN)
    attempt: int | None = Field(default=None, ge=0)
    outcome: AttemptOutcome
    reason: Annotated[str, StringConstraints(max_length=1024)] | None = None
    time: AwareDatetime
    # What the attempt was accounted on each budget its task names (docs/budgets.md).
    usage: list[BudgetUsage] | None = Field(default=None, max_length=MAX_BUDGETS)

    @model_validator(mode="after")
    def _one_usage_per_budget(self) -> Self:
        _refuse_repeated_names(self.usage, "usage")
        return self


class AgentTaskStatus(_StatusModel):
    """``AgentTask.status``, written by the operator only."""

    # The CRD defaults it: a new task reads as Pending before the operator writes anything.
    phase: TaskPhase | None = TaskPhase.PENDING
    worker: ObjectName | None = None
    # The current claim's worker's namespace, when it is not the task's (docs/tenancy.md).
    worker_namespace: (
        Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=CAPABILITY_PATTERN)]
        | None
    ) = None
    attempt: int | None = Field(default=None, ge=0)
    reclaims: int | None = Field(default=None, ge=0)
    fencing_token: int | None = Field(default=None, ge=0, le=MAX_TOKEN)
    # The granting leader's epoch (its election Lease's leaseTransitions, an int32).
    leader_epoch: int | None = Field(default=None, ge=0, le=2**31 - 1)
    lease_name: Annotated[str, StringConstraints(max_length=253)] | None = None
    assigned_at: AwareDatetime | None = None
    start_time: AwareDatetime | None = None  # the first grant: activeDeadlineSeconds counts
    started_at: AwareDatetime | None = None
    finished_at: AwareDatetime | None = None
    last_transition_time: AwareDatetime | None = None
    not_before: AwareDatetime | None = None
    grace_until: AwareDatetime | None = None
    progress: Annotated[str, StringConstraints(max_length=1024)] | None = None
    result: JsonValue = None
    result_ref: Annotated[str, StringConstraints(max_length=4096)] | None = None
    error: TaskError | None = None
    # The operator keeps the newest MAX_HISTORY entries; more is refused by the API server.
    history: list[AttemptRecord] | None = Field(default=None, max_length=MAX_HISTORY)
    requeue_handled: Annotated[str, StringConstraints(max_length=256)] | None = None
    refused_reports: int | None = Field(default=None, ge=0)
    conditions: Conditions | None = None
    observed_generation: int | None = Field(default=None, ge=0)


# --- AgentQueue ------------------------------------------------------------------

_SELECTOR_VALUES = (
    "values must be non-empty for In and NotIn, and empty for Exists and DoesNotExist"
)
LabelValue = Annotated[str, StringConstraints(max_length=63)]


class LabelSelectorRequirement(_Model):
    """One ``matchExpressions`` entry of a ``metav1.LabelSelector``."""

    key: Annotated[str, StringConstraints(min_length=1, max_length=317)]
    operator: SelectorOperator
    values: list[LabelValue] | None = Field(default=None, max_length=64)

    @model_validator(mode="after")
    def _values_fit_the_operator(self) -> Self:
        # The CRD's CEL rule, same message.
        wants = self.operator in (SelectorOperator.IN, SelectorOperator.NOT_IN)
        if wants != bool(self.values):
            raise ValueError(_SELECTOR_VALUES)
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.operator is SelectorOperator.IN:
            return value is not None and value in (self.values or ())
        if self.operator is SelectorOperator.NOT_IN:
            return value is None or value not in (self.values or ())
        if self.operator is SelectorOperator.EXISTS:
            return value is not None
        return value is None


class LabelSelector(_Model):
    """A ``metav1.LabelSelector``: every matchLabels pair and every expression must hold
    (an empty selector selects everything)."""

    match_labels: dict[str, LabelValue] | None = Field(default=None, max_length=64)
    match_expressions: list[LabelSelectorRequirement] | None = Field(default=None, max_length=64)

    def matches(self, labels: Mapping[str, str]) -> bool:
        for key, value in (self.match_labels or {}).items():
            if labels.get(key) != value:
                return False
        return all(e.matches(labels) for e in self.match_expressions or ())


class AgentQueueSpec(_Model):
    """``AgentQueue.spec``: who may use the queue, where its workers live, its share."""

    weight: JsonFloat = Field(default=1.0, le=1000, json_schema_extra={"minimum": MIN_WEIGHT})
    parent: QueueName | None = None
    namespace_selector: LabelSelector | None = None
    worker_namespace: (
        Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=CAPABILITY_PATTERN)]
        | None
    ) = None
    max_in_flight: JsonInt | None = Field(default=None, ge=1, le=1_000_000)

    @field_validator("weight")
    @classmethod
    def _weight_at_least_minimum(cls, weight: float) -> float:
        if not weight >= MIN_WEIGHT:
            raise ValueError("weight must be at least 0.001")
        return weight

    def admits(self, labels: Mapping[str, str]) -> bool:
        """Whether a namespace with ``labels`` may use the queue (no selector: none may)."""
        return self.namespace_selector is not None and self.namespace_selector.matches(labels)


class AgentQueueStatus(_StatusModel):
    """``AgentQueue.status``, written by the operator only."""

    pending: int | None = Field(default=None, ge=0)
    in_flight: int | None = Field(default=None, ge=0)
    served_cost: float | None = Field(default=None, ge=0)
    share: float | None = Field(default=None, ge=0, le=1)
    weight_share: float | None = Field(default=None, ge=0, le=1)
    conditions: Conditions | None = None
    observed_generation: int | None = Field(default=None, ge=0)


# --- AgentBudget -----------------------------------------------------------------


class AgentBudgetSpec(_Model):
    """``AgentBudget.spec``: a provider's limits; each optional (absent: no limit)."""

    requests_per_minute: JsonInt | None = Field(default=None, ge=1, le=MAX_BUDGET_REQUESTS)
    tokens_per_minute: JsonInt | None = Field(default=None, ge=1, le=MAX_BUDGET_TOKENS)
    max_concurrent: JsonInt | None = Field(default=None, ge=1, le=MAX_CONCURRENT)


class WindowBucket(_StatusModel):
    """One bucket of ``AgentBudget.status.window``: the usage placed from ``start`` on for
    the window's ``bucketSeconds``."""

    start: AwareDatetime
    requests: int | None = Field(default=None, ge=0)
    tokens: int | None = Field(default=None, ge=0)


class BudgetWindow(_StatusModel):
    """``AgentBudget.status.window``: the last minute's usage, what a new leader resumes
    from (docs/budgets.md)."""

    as_of: AwareDatetime
    bucket_seconds: int = Field(ge=1, le=60)
    buckets: list[WindowBucket] | None = Field(default=None, max_length=61)


class AgentBudgetStatus(_StatusModel):
    """``AgentBudget.status``, written by the operator only."""

    in_use: int | None = Field(default=None, ge=0)
    used_requests: int | None = Field(default=None, ge=0)
    used_tokens: int | None = Field(default=None, ge=0)
    reserved_requests: int | None = Field(default=None, ge=0)
    reserved_tokens: int | None = Field(default=None, ge=0)
    available_requests: int | None = Field(default=None, ge=0)
    available_tokens: int | None = Field(default=None, ge=0)
    available_concurrency: int | None = Field(default=None, ge=0)
    throttled_until: AwareDatetime | None = None
    waiting: int | None = Field(default=None, ge=0)
    window: BudgetWindow | None = None
    conditions: Conditions | None = None
    observed_generation: int | None = Field(default=None, ge=0)


# --- whole objects ---------------------------------------------------------------


class ObjectMeta(_Model):
    """The part of ``metadata`` agentq reads (``resource_version`` for compare-and-swap)."""

    name: str
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: datetime | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class _Object(_Model):
    """What both kinds share: metadata, and a name short enough to be a label value."""

    _label: ClassVar[str]
    metadata: ObjectMeta

    @model_validator(mode="after")
    def _name_fits_a_label(self) -> Self:
        if len(self.metadata.name) > MAX_NAME_LENGTH:
            raise ValueError(f"metadata.name must be at most 63 characters: {self._why_short()}")
        return self

    def _why_short(self) -> str:
        # The CRD's CEL rule says the same.
        return f"it is used as the value of the {self._label} label"

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str | None:
        return self.metadata.namespace


class AgentTask(_Object):
    """A whole AgentTask object."""

    _label: ClassVar[str] = "agentq.dev/task"
    api_version: Literal["agentq.dev/v1alpha1"] = "agentq.dev/v1alpha1"
    kind: Literal["AgentTask"] = "AgentTask"
    metadata: ObjectMeta
    spec: AgentTaskSpec = AgentTaskSpec()
    status: AgentTaskStatus = Field(default_factory=AgentTaskStatus)


class AgentWorker(_Object):
    """A whole AgentWorker object."""

    _label: ClassVar[str] = "agentq.dev/worker"
    api_version: Literal["agentq.dev/v1alpha1"] = "agentq.dev/v1alpha1"
    kind: Literal["AgentWorker"] = "AgentWorker"
    metadata: ObjectMeta
    spec: AgentWorkerSpec
    status: AgentWorkerStatus = Field(default_factory=AgentWorkerStatus)

    @property
    def lease_name(self) -> str:
        """The worker Lease its sidecar renews: ``agentq-worker-<name>``."""
        return f"agentq-worker-{self.metadata.name}"


class AgentQueue(_Object):
    """A whole AgentQueue object (cluster-scoped)."""

    _label: ClassVar[str] = "agentq.dev/queue"
    api_version: Literal["agentq.dev/v1alpha1"] = "agentq.dev/v1alpha1"
    kind: Literal["AgentQueue"] = "AgentQueue"
    metadata: ObjectMeta
    spec: AgentQueueSpec = AgentQueueSpec()
    status: AgentQueueStatus = Field(default_factory=AgentQueueStatus)

    @model_validator(mode="after")
    def _not_its_own_parent(self) -> Self:
        if self.spec.parent == self.metadata.name:
            raise ValueError("a queue cannot be its own parent")
        return self


class AgentBudget(_Object):
    """A whole AgentBudget object (cluster-scoped)."""

    _label: ClassVar[str] = "agentq.dev/budget"
    api_version: Literal["agentq.dev/v1alpha1"] = "agentq.dev/v1alpha1"
    kind: Literal["AgentBudget"] = "AgentBudget"
    metadata: ObjectMeta
    spec: AgentBudgetSpec = AgentBudgetSpec()
    status: AgentBudgetStatus = Field(default_factory=AgentBudgetStatus)

    def _why_short(self) -> str:
        return "tasks name it in spec.budgets and metrics in their budget label"


# --- parsing ---------------------------------------------------------------------


# Objects nested deeper than this are refused (``ModelError``) before anything copies
# or validates them: both recurse. The API server accepts payloads thousands of levels
# deep; the operator fails such a task (PayloadTooDeep, at 64 levels of payload), and a
# reader of it (``agentq explain``, ``top``) must skip it, not crash.
MAX_MODEL_DEPTH = 100


def _nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests Mappings and Sequences more than ``limit`` deep (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, Sequence) and not isinstance(item, str | bytes | bytearray):
            children = item
        else:
            continue
        if depth + 1 > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def to_plain(value: Any) -> Any:
    """A deep copy of ``value`` with every Mapping made a dict and every list a list.

    kopf hands handlers read-only Mapping views (``Body``, ``Spec``, ``Status``);
    pydantic wants plain dicts. Raises ``ModelError`` for an object nested deeper than
    ``MAX_MODEL_DEPTH`` (checked once, without recursion, before the copy recurses).
    """
    if _nested_deeper_than(value, MAX_MODEL_DEPTH):
        raise ModelError(f"nested deeper than {MAX_MODEL_DEPTH} levels")
    return _copy(value)


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _copy(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray):
        return [_copy(v) for v in value]
    return value


_M = TypeVar("_M", bound=BaseModel)


def _describe(errors: ValidationError) -> str:
    parts = []
    for err in errors.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "(object)"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def _parse(model: type[_M], data: Mapping[str, Any] | None, what: str) -> _M:
    try:
        return model.model_validate(to_plain(data) if data is not None else {})
    except ModelError as exc:
        raise ModelError(f"{what} is {exc}") from None
    except ValidationError as exc:
        raise ModelError(f"{what} does not fit the agentq.dev schema: {_describe(exc)}") from exc


def _identify(kind: str, body: Mapping[str, Any]) -> str:
    meta = body.get("metadata") or {}
    name = meta.get("name", "?") if isinstance(meta, Mapping) else "?"
    namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def parse_task(body: Mapping[str, Any]) -> AgentTask:
    """A whole AgentTask (API server dict or kopf ``Body``); raises ``ModelError``."""
    return _parse(AgentTask, body, _identify("AgentTask", body))


def parse_worker(body: Mapping[str, Any]) -> AgentWorker:
    """A whole AgentWorker (API server dict or kopf ``Body``); raises ``ModelError``."""
    return _parse(AgentWorker, body, _identify("AgentWorker", body))


def parse_task_spec(spec: Mapping[str, Any] | None) -> AgentTaskSpec:
    """``AgentTask.spec`` (e.g. kopf's ``spec`` kwarg); raises ``ModelError``."""
    return _parse(AgentTaskSpec, spec, "AgentTask spec")


def parse_task_status(status: Mapping[str, Any] | None) -> AgentTaskStatus:
    """``AgentTask.status``; a missing or empty status gives an empty model."""
    return _parse(AgentTaskStatus, status, "AgentTask status")


def parse_worker_spec(spec: Mapping[str, Any] | None) -> AgentWorkerSpec:
    """``AgentWorker.spec`` (e.g. kopf's ``spec`` kwarg); raises ``ModelError``."""
    return _parse(AgentWorkerSpec, spec, "AgentWorker spec")


def parse_worker_status(status: Mapping[str, Any] | None) -> AgentWorkerStatus:
    """``AgentWorker.status``; a missing or empty status gives an empty model."""
    return _parse(AgentWorkerStatus, status, "AgentWorker status")


def parse_queue(body: Mapping[str, Any]) -> AgentQueue:
    """A whole AgentQueue (API server dict); raises ``ModelError``."""
    return _parse(AgentQueue, body, _identify("AgentQueue", body))


def parse_budget(body: Mapping[str, Any]) -> AgentBudget:
    """A whole AgentBudget (API server dict); raises ``ModelError``."""
    return _parse(AgentBudget, body, _identify("AgentBudget", body))
