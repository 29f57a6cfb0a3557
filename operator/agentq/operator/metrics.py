"""Prometheus metrics of the operator, all prefixed ``agentq_``.

Counters count transitions the leader committed; gauges are kept current by the
controller's indexes as events arrive (a new leader recomputes them from its
caches when it takes over). Series of a deleted worker or AgentQueue are removed with
it (their label values come from object names: queues are few and admin-made).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

DISPATCHES = Counter("agentq_dispatches_total", "Tasks assigned to a worker.", ["namespace"])
DISPATCH_LATENCY = Histogram(
    "agentq_dispatch_latency_seconds",
    "From a task becoming dispatchable to its assignment being committed.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
EXPIRY_LAG = Histogram(
    "agentq_expiry_lag_seconds",
    "From a claim's lease expiring, or the grace period it was given ending (by the "
    "operator's clock), to the decision about it (reclaim, dead letter, hold, grace) "
    "being committed.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 10, 30),
)
COMMIT_CONFLICTS = Counter(
    "agentq_commit_conflicts_total", "Decisions dropped because the object changed (409).", ["kind"]
)
RECLAIMS = Counter("agentq_reclaims_total", "Failed attempts reclaimed, by reason.", ["reason"])
DEAD_LETTERS = Counter("agentq_dead_letters_total", "Tasks moved to DeadLettered.", ["namespace"])
HELD = Counter("agentq_held_total", "Tasks held after their lease expired (onLeaseExpiry: Hold).")
STALE_REPORTS = Counter(
    "agentq_stale_reports_refused_total", "Reports refused for a stale fencing token or holder."
)
COMPLETIONS = Counter("agentq_completions_total", "Reports committed, by outcome.", ["outcome"])
PENDING = Gauge(
    "agentq_pending_tasks",
    "Tasks waiting for a worker, by required capability set.",
    ["capabilities"],
)
NAMESPACE_PENDING = Gauge(
    "agentq_namespace_pending_tasks",
    "Tasks waiting for a worker, by namespace and required capability set (what an "
    "autoscaled agent pool of that namespace scales on; docs/autoscaling.md).",
    ["namespace", "capabilities"],
)
TASKS_BY_PHASE = Gauge("agentq_tasks", "Tasks by phase.", ["phase"])
WORKER_DEFICIT = Gauge("agentq_worker_deficit", "DRR deficit of a worker.", ["namespace", "worker"])
WORKER_IN_FLIGHT = Gauge(
    "agentq_worker_in_flight", "Tasks in flight on a worker.", ["namespace", "worker"]
)
WORKER_READY = Gauge(
    "agentq_worker_ready", "1 if the worker's own Lease is fresh.", ["namespace", "worker"]
)
QUEUE_PENDING = Gauge(
    "agentq_queue_pending",
    "Pending tasks naming the AgentQueue or a queue below it (its status.pending).",
    ["queue"],
)
QUEUE_IN_FLIGHT = Gauge(
    "agentq_queue_in_flight",
    "Claimed (Assigned or Running) tasks of the AgentQueue's subtree (its status.inFlight).",
    ["queue"],
)
QUEUE_SERVED_COST = Gauge(
    "agentq_queue_served_cost",
    "Cumulative cost granted from the AgentQueue (its subtree), continued across leaders "
    "from its status.servedCost.",
    ["queue"],
)
QUEUE_SHARE_ERROR = Gauge(
    "agentq_queue_share_error",
    "The AgentQueue's share of its siblings' cost granted since this leader started, less "
    "its weight share (status.share - status.weightShare); absent before any grant.",
    ["queue"],
)
QUEUE_WEIGHT_SHARE = Gauge(
    "agentq_queue_weight_share",
    "The AgentQueue's weight over the sum of its siblings' weights, its own included "
    "(status.weightShare): what agentq_queue_share_error is measured against.",
    ["queue"],
)
QUEUE_CAPPED = Gauge(
    "agentq_queue_capped",
    "1 while the AgentQueue or a queue above it holds its spec.maxInFlight claims (its "
    "share is held down by that cap), else 0.",
    ["queue"],
)
LEADER = Gauge("agentq_leader", "1 while this replica is the leader.")
LEADER_EPOCH_POLICY_STALE = Gauge(
    "agentq_leader_epoch_policy_stale",
    "1 once the admission policy agentq-leader-epoch was found reading a stale election "
    "Lease (an API server bug after its binding was made again): it no longer fences a "
    "deposed leader until the API server restarts.",
)
LEADER_TRANSITIONS = Counter(
    "agentq_leader_transitions_total", "Times this replica gained or lost leadership."
)
UNSCHEDULABLE = Gauge(
    "agentq_unschedulable_tasks",
    "Pending tasks no AgentWorker of the namespace can take (capabilities missing).",
    ["namespace"],
)
OLDEST_PENDING = Gauge(
    "agentq_oldest_pending_age_seconds",
    "How long the oldest pending task of the set has waited.",
    ["namespace", "capabilities"],
)
RECONCILE = Histogram(
    "agentq_reconcile_duration_seconds",
    "CPU-bound time of one controller step (timers, decisions, dispatch, publish).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
LOOP_LAG = Gauge(
    "agentq_loop_lag_seconds", "How late the event loop ran against its due time (last tick)."
)
API_SILENCE = Counter(
    "agentq_api_silence_seconds_total",
    "Seconds the API server answered nothing while a request waited (given back to Leases).",
)
WATCH_HEALTHY = Gauge(
    "agentq_watch_healthy",
    "1 while the watch of the resource is connected and current.",
    ["resource"],
)
UNPROCESSABLE = Counter(
    "agentq_unprocessable_total",
    "Inputs refused as unprocessable (a task, a report, a Lease, a worker), by reason.",
    ["kind", "reason"],
)
TASKS_DELETED = Counter(
    "agentq_tasks_deleted_total",
    "Finished tasks deleted once their ttlSecondsAfterFinished (or TTL_AFTER_FINISHED) passed.",
)
INVARIANT_VIOLATIONS = Counter(
    "agentq_invariant_violations_total",
    "Differences found between an index and what the store's records say (each is a bug: "
    "the log names the object; the index is rebuilt at the next resync).",
    ["index"],
)
EVENTS_DROPPED = Counter(
    "agentq_events_dropped_total",
    "Kubernetes Events not recorded because the API server was too slow to take them.",
)
EVENTS_QUEUED = Gauge(
    "agentq_events_queued",
    "Kubernetes Events waiting to be written (they yield to decisions while those wait).",
)

CLAIM_API_REQUESTS = Counter(
    "agentq_claim_api_requests_total",
    "Requests to the claim API (a cross-namespace claim's task for its holder), by the "
    "HTTP status answered (403: refused; 404: claim not known here; 410: claim over).",
    ["code"],
)


class OptionalGauge(Collector):
    """An unlabelled gauge with no sample until it is set, and again after ``clear()``:
    always declared (``# HELP``/``# TYPE``), so dashboards and rules may name it, but an
    alert on its value never sees a process where it does not apply."""

    def __init__(self, name: str, documentation: str) -> None:
        self.name = name
        self.documentation = documentation
        self.value: float | None = None
        REGISTRY.register(self)

    def set(self, value: float) -> None:
        self.value = float(value)

    def clear(self) -> None:
        self.value = None

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self.name, self.documentation)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.name, self.documentation)
        if self.value is not None:
            family.add_metric([], self.value)
        yield family


# Claim port TLS: no sample at all while the claim port is off or plain HTTP (no
# --claim-cert-file/--claim-key-file), so AgentqClaimTLSNotServing and
# AgentqClaimCertExpiring never see such an operator.
CLAIM_TLS_READY = OptionalGauge(
    "agentq_claim_tls_ready",
    "1 while the claim port serves TLS with a loaded certificate; 0 while it is given "
    "certificate files but has none loaded to serve (handshakes refused); no sample "
    "when the claim port is off or plain HTTP.",
)
CLAIM_TLS_NOT_AFTER = OptionalGauge(
    "agentq_claim_tls_not_after_seconds",
    "Expiry (Unix time) of the claim port's served TLS certificate; 0 when unknown; no "
    "sample before a certificate is loaded, or when the claim port is off or plain HTTP.",
)
CLAIM_TLS_RELOADS = Counter(
    "agentq_claim_tls_reloads_total",
    "Loads of the claim port's TLS certificate and key from their files, by result "
    "(error: the previous pair, if any, is still served).",
    ["result"],
)


def forget_worker(namespace: str, worker: str) -> None:
    """Drop the series of a deleted worker (they would otherwise be kept forever)."""
    for gauge in (WORKER_DEFICIT, WORKER_IN_FLIGHT, WORKER_READY):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, worker)


BUDGET_LIMIT = Gauge(
    "agentq_budget_limit",
    "The AgentBudget's limit (resource: requests or tokens per minute, concurrent claims).",
    ["budget", "resource"],
)
BUDGET_USED = Gauge(
    "agentq_budget_used",
    "Usage placed on the AgentBudget in the last minute (concurrent: claims held).",
    ["budget", "resource"],
)
BUDGET_RESERVED = Gauge(
    "agentq_budget_reserved",
    "Estimates of the AgentBudget's running attempts not yet reported spent.",
    ["budget", "resource"],
)
BUDGET_AVAILABLE = Gauge(
    "agentq_budget_available",
    "limit - used - reserved of the AgentBudget (concurrent: maxConcurrent - inUse).",
    ["budget", "resource"],
)
BUDGET_THROTTLED = Gauge(
    "agentq_budget_throttled", "1 while a throttle pauses the AgentBudget.", ["budget"]
)
BUDGET_WAITING = Gauge(
    "agentq_budget_waiting_tasks",
    "Pending tasks naming the AgentBudget (not those it can never admit).",
    ["budget"],
)
BUDGET_OVERSIZED = Gauge(
    "agentq_budget_oversized_tasks",
    "Tasks whose estimate exceeds the AgentBudget's per-minute limit (never granted).",
    ["budget"],
)
BUDGET_GRANTS = Counter(
    "agentq_budget_grants_total", "Grants that debited the AgentBudget.", ["budget"]
)
BUDGET_CORRECTIONS = Counter(
    "agentq_budget_corrections_total",
    "Amounts agents' reports corrected on the AgentBudget: refund (below the estimate) or "
    "extra (above).",
    ["budget", "resource", "direction"],
)
BUDGET_THROTTLES = Counter(
    "agentq_budget_throttles_total", "Throttle reports applied to the AgentBudget.", ["budget"]
)


def set_or_drop(gauge: Gauge, labels: tuple[str, ...], value: float | None) -> None:
    """Set a labelled series, or drop it for None (a limit the spec does not set)."""
    if value is None:
        with contextlib.suppress(KeyError):
            gauge.remove(*labels)
    else:
        gauge.labels(*labels).set(value)


def forget_budget(budget: str) -> None:
    """Drop the series of a deleted AgentBudget."""
    for gauge in (BUDGET_LIMIT, BUDGET_USED, BUDGET_RESERVED, BUDGET_AVAILABLE):
        for resource in ("requests", "tokens", "concurrent"):
            with contextlib.suppress(KeyError):
                gauge.remove(budget, resource)
    for resource in ("requests", "tokens"):
        for direction in ("extra", "refund"):
            with contextlib.suppress(KeyError):
                BUDGET_CORRECTIONS.remove(budget, resource, direction)
    for single in (
        BUDGET_THROTTLED,
        BUDGET_WAITING,
        BUDGET_OVERSIZED,
        BUDGET_GRANTS,
        BUDGET_THROTTLES,
    ):
        with contextlib.suppress(KeyError):
            single.remove(budget)


def forget_queue(queue: str) -> None:
    """Drop the series of a deleted AgentQueue."""
    for gauge in (
        QUEUE_PENDING,
        QUEUE_IN_FLIGHT,
        QUEUE_SERVED_COST,
        QUEUE_SHARE_ERROR,
        QUEUE_WEIGHT_SHARE,
        QUEUE_CAPPED,
    ):
        with contextlib.suppress(KeyError):
            gauge.remove(queue)


def serve(port: int) -> None:
    """Serve /metrics on ``port`` (0 disables)."""
    if port:
        start_http_server(port)
