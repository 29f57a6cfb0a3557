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
    # DISPATCH_BATCH: most tasks decided per namespace in one pass (bounds a pass's latency).
    dispatch_batch: int = 500
    # WRITE_CONCURRENCY: API writes in flight at once (threads of the sync client).
    write_concurrency: int = 16
    # METRICS_PORT: Prometheus /metrics on 0.0.0.0:port; 0 disables.
    metrics_port: int = 8080
    # LEADER_ELECTION: off only for a single replica run by hand.
    leader_election: bool = True
    # LEADER_NAMESPACE / LEADER_LEASE: where the replicas elect a leader.
    leader_namespace: str = "default"
    leader_lease: str = "agentq-operator"
    # LEADER_LEASE_SECONDS: a dead leader is replaced within this (plus one retry period).
    leader_lease_seconds: float = 15.0
    leader_renew_seconds: float = 10.0
    leader_retry_seconds: float = 2.0
    # WORKER_STATUS_INTERVAL: least time between two status writes of one worker.
    worker_status_interval: float = 1.0
    identity: str = field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    )

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
        }
        for var, (name, cast) in casts.items():
            if var in env:
                out[name] = cast(env[var])
        if "NAMESPACES" in env:
            out["namespaces"] = tuple(n for n in env["NAMESPACES"].split(",") if n)
        if "LEADER_ELECTION" in env:
            out["leader_election"] = env["LEADER_ELECTION"].lower() not in ("0", "false", "no")
        return out
