"""Prometheus metrics of the operator, all prefixed ``agentq_``.

Counters count transitions the leader committed; gauges are recomputed from
the store on every controller pass, so a new leader reports correct values
from its first pass.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

DISPATCHES = Counter("agentq_dispatches_total", "Tasks assigned to a worker.", ["namespace"])
DISPATCH_LATENCY = Histogram(
    "agentq_dispatch_latency_seconds",
    "From a task becoming dispatchable to its assignment being committed.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
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
TASKS_BY_PHASE = Gauge("agentq_tasks", "Tasks by phase.", ["phase"])
WORKER_DEFICIT = Gauge("agentq_worker_deficit", "DRR deficit of a worker.", ["namespace", "worker"])
WORKER_IN_FLIGHT = Gauge(
    "agentq_worker_in_flight", "Tasks in flight on a worker.", ["namespace", "worker"]
)
WORKER_READY = Gauge(
    "agentq_worker_ready", "1 if the worker's own Lease is fresh.", ["namespace", "worker"]
)
LEADER = Gauge("agentq_leader", "1 while this replica is the leader.")


def serve(port: int) -> None:
    """Serve /metrics on ``port`` (0 disables)."""
    if port:
        start_http_server(port)
