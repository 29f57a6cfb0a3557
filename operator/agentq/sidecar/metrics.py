"""The sidecar's Prometheus metrics (served at ``/metrics`` on its metrics port, apart
from the agent API, so scraping needs no secret).

A registry of its own, so a process that embeds the sidecar (a test) gets no
clash with the operator's default registry. The API request counter is read
from ``KubeApi.requests`` at scrape time: one count per request actually sent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry(auto_describe=True)

RENEWALS = Counter(
    "agentq_sidecar_renewals_total",
    "Task Lease renewals, by result (ok, lost, error).",
    ["result"],
    registry=REGISTRY,
)
RENEWAL_REQUESTS = Histogram(
    "agentq_sidecar_renewal_api_requests",
    "API requests one successful renewal took (1; 3 after a conflict).",
    buckets=(1, 2, 3, 4),
    registry=REGISTRY,
)
RENEWAL_LATENCY = Histogram(
    "agentq_sidecar_renewal_latency_seconds",
    "From the moment a renewal was due and the agent had beaten, to the API server's answer.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
    registry=REGISTRY,
)
HEARTBEATS = Counter(
    "agentq_sidecar_heartbeats_total", "Heartbeats accepted from the agent.", registry=REGISTRY
)
REPORTS = Counter(
    "agentq_sidecar_reports_total",
    "Reports written on task Leases, by outcome.",
    ["outcome"],
    registry=REGISTRY,
)
THROTTLES = Counter(
    "agentq_sidecar_throttles_total",
    "Throttles (a provider's 429 with retry-after) the agent reported, written on task Leases.",
    registry=REGISTRY,
)
AGENT_ERRORS = Counter(
    "agentq_sidecar_agent_errors_total",
    "Requests from the agent answered with an error, by error code.",
    ["code"],
    registry=REGISTRY,
)
CLAIM_READS = Counter(
    "agentq_sidecar_claim_reads_total",
    "Reads of cross-namespace claims' tasks from the operator, by answer: the HTTP status "
    "(200; 403 refused, 404 not known yet, 410 ended, ...), 'tls' when no TLS connection "
    "was made (the operator's certificate refused, or no CA bundle to trust), or 'error' "
    "without an answer.",
    ["code"],
    registry=REGISTRY,
)
ASSIGNMENTS = Gauge(
    "agentq_sidecar_assignments", "Attempts offered to the agent now.", registry=REGISTRY
)
WORKER_LEASE_HELD = Gauge(
    "agentq_sidecar_worker_lease_held",
    "1 while this sidecar holds its worker Lease.",
    registry=REGISTRY,
)
WATCH_SYNCED = Gauge(
    "agentq_sidecar_watch_synced",
    "1 while the task Lease watch is listed and connected.",
    registry=REGISTRY,
)


class ApiRequestCollector(Collector):
    """``agentq_sidecar_api_requests_total{verb,resource}`` from a live counter."""

    def __init__(self, source: Callable[[], dict[tuple[str, str], int]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "agentq_sidecar_api_requests",
            "Requests this sidecar sent to the Kubernetes API server.",
            labels=["verb", "resource"],
        )
        for (verb, resource), count in sorted(self._source().items()):
            family.add_metric([verb, resource], count)
        yield family

    def describe(self) -> Iterator[Any]:
        return iter(())
