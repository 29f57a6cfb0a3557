"""Operator settings: every field has a flag, an environment variable and a default.

Flags win over environment variables, which win over the defaults below.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass, field


@dataclass(frozen=True)
class OperatorConfig:
    # MAX_RECLAIMS: failed attempts a task may have before it is dead-lettered, when its
    # spec does not say (maxReclaims). 3 means at most 4 attempts.
    max_reclaims: int = 3
    # DEFAULT_LEASE_SECONDS: lease duration for tasks whose spec does not say; the CRD
    # default is the same, so this only matters for objects created before the CRD had it.
    default_lease_seconds: int = 30
    # RECONCILE_INTERVAL: the periodic sweep; exact timers wake the loop earlier for a
    # known lease deadline, so this bounds recovery only when a timer is missed.
    reconcile_interval: float = 2.0
    # NAMESPACES: comma-separated namespaces to watch; empty means cluster-wide.
    namespaces: tuple[str, ...] = ()
    # DISPATCH_BATCH: most grants in flight at once (bounds the work of one step, and how
    # far decisions run ahead of their writes).
    dispatch_batch: int = 256
    # WRITE_CONCURRENCY: API requests in flight at once (the client's connection pool).
    write_concurrency: int = 32
    # METRICS_PORT: Prometheus /metrics on 0.0.0.0:port; 0 disables.
    metrics_port: int = 8080
    # LEADER_ELECTION: off only for a single replica run by hand.
    leader_election: bool = True
    # LEADER_NAMESPACE / LEADER_LEASE: where the replicas elect a leader.
    leader_namespace: str = "default"
    leader_lease: str = "agentq-operator"
    # LEADER_LEASE_SECONDS: a dead leader is replaced within this (plus one retry period).
    leader_lease_seconds: float = 15.0
    # LEADER_RENEW_SECONDS: a leader that could not renew for this long stops deciding. It
    # must be below the lease (else a stale leader decides after the standby took over);
    # None: two thirds of the lease, at most 10 s (client-go's 15 / 10).
    leader_renew_seconds: float | None = None
    leader_retry_seconds: float = 2.0
    # WORKER_STATUS_INTERVAL: least time between two status writes of one worker whose
    # counts changed (a change of phase or readiness is written at once). Worker status is
    # a report for people: it must stay a small fraction of the dispatch writes.
    worker_status_interval: float = 30.0
    # WORKER_STATUS_QPS: most writes per second of a worker's changed phase or readiness,
    # all workers together.
    worker_status_qps: float = 20.0
    # WORKER_COUNTS_QPS: most writes per second of workers' changed counts alone (in
    # flight, served cost), all workers together: at 100 dispatches a second, one write
    # per 100 dispatches. Status counts are a snapshot; the per-worker metrics follow the
    # scheduling core within a second.
    worker_counts_qps: float = 1.0
    # PROGRESS_STATUS_INTERVAL: least time between two copies of a claim's progress marker
    # into the task's status (a renewal alone never costs a write).
    progress_status_interval: float = 10.0
    # RESYNC_INTERVAL: the safety net -- every task is decided again this often even if no
    # event or timer asked for it.
    resync_interval: float = 300.0
    # REQUEST_TIMEOUT: seconds before an API call's outcome is taken as unknown.
    request_timeout: float = 10.0
    # TOKEN_BLOCK: fencing tokens reserved per write of the durable counter (the Lease
    # TOKEN_LEASE in LEADER_NAMESPACE).
    token_block: int = 1000
    token_lease: str = "agentq-fencing-tokens"
    # STALL_SECONDS: the event loop running this late means the process was stopped (or
    # starved): the time is given back to every Lease instead of counted against it.
    stall_seconds: float = 1.0
    # API_SILENCE_SECONDS: a request of ours waiting this long with nothing at all heard
    # from the API server (no reply, no watch line) means it was not serving: holders
    # could not renew either, and the time is given back to every Lease (silence.py).
    api_silence_seconds: float = 2.0
    # WATCHER: the watch machinery: informer (default) or kopf, both with watch health and
    # a real synced signal; docs/operator.md says when to pick which.
    watcher: str = "informer"
    identity: str = field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    )

    @property
    def leader_renew_deadline(self) -> float:
        """The renew deadline in force (see LEADER_RENEW_SECONDS)."""
        if self.leader_renew_seconds is not None:
            return self.leader_renew_seconds
        return min(10.0, self.leader_lease_seconds * 2 / 3)

    def check(self) -> None:
        """Refuse settings that break a guarantee (as client-go's NewLeaderElector does)."""
        if self.leader_renew_deadline >= self.leader_lease_seconds:
            raise ValueError(
                f"the leader renew deadline ({self.leader_renew_deadline}s) must be below the "
                f"leader lease ({self.leader_lease_seconds}s): else a leader that lost the lease "
                "keeps deciding after the standby took over"
            )
        if self.leader_retry_seconds >= self.leader_renew_deadline:
            raise ValueError(
                f"the leader retry period ({self.leader_retry_seconds}s) must be below the renew "
                f"deadline ({self.leader_renew_deadline}s)"
            )
        if not self.api_silence_seconds > 0:
            raise ValueError("API_SILENCE_SECONDS must be above 0")
        for name in ("worker_status_qps", "worker_counts_qps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name.upper()} must be above 0 (writes a second)")
        if self.watcher not in ("informer", "kopf"):
            raise ValueError(f"unknown watcher {self.watcher!r} (informer or kopf)")

    @classmethod
    def env_defaults(cls, environ: dict[str, str] | None = None) -> dict[str, object]:
        """Values set by environment variables (names as in the comments above)."""
        env = os.environ if environ is None else environ
        out: dict[str, object] = {}
        casts: dict[str, tuple[str, type]] = {
            "MAX_RECLAIMS": ("max_reclaims", int),
            "DEFAULT_LEASE_SECONDS": ("default_lease_seconds", int),
            "RECONCILE_INTERVAL": ("reconcile_interval", float),
            "DISPATCH_BATCH": ("dispatch_batch", int),
            "WRITE_CONCURRENCY": ("write_concurrency", int),
            "METRICS_PORT": ("metrics_port", int),
            "LEADER_NAMESPACE": ("leader_namespace", str),
            "LEADER_LEASE": ("leader_lease", str),
            "LEADER_LEASE_SECONDS": ("leader_lease_seconds", float),
            "LEADER_RENEW_SECONDS": ("leader_renew_seconds", float),
            "WORKER_STATUS_INTERVAL": ("worker_status_interval", float),
            "WORKER_STATUS_QPS": ("worker_status_qps", float),
            "WORKER_COUNTS_QPS": ("worker_counts_qps", float),
            "PROGRESS_STATUS_INTERVAL": ("progress_status_interval", float),
            "RESYNC_INTERVAL": ("resync_interval", float),
            "REQUEST_TIMEOUT": ("request_timeout", float),
            "API_SILENCE_SECONDS": ("api_silence_seconds", float),
            "TOKEN_BLOCK": ("token_block", int),
            "WATCHER": ("watcher", str),
        }
        for var, (name, cast) in casts.items():
            if var in env:
                out[name] = cast(env[var])
        if "NAMESPACES" in env:
            out["namespaces"] = tuple(n for n in env["NAMESPACES"].split(",") if n)
        if "LEADER_ELECTION" in env:
            out["leader_election"] = env["LEADER_ELECTION"].lower() not in ("0", "false", "no")
        return out
