"""Operator settings: every field below has a flag and an environment variable made
from its name (``max_reclaims``: ``--max-reclaims``, ``AGENTQ_MAX_RECLAIMS``) and a
default. Flags win over environment variables, which win over the defaults.

``agentq operator`` makes its options from these fields (operator/command.py); the
help text, the bounds a value must keep and the default as people read it live beside
each field, so the flags, ``--help`` and docs/operator.md (a test compares the table)
cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "AGENTQ_"


@dataclass(frozen=True)
class Flag:
    """How one setting is given: its help, the bounds of its value, its default as shown."""

    help: str
    at_least: float | None = None
    above: float | None = None  # exclusive lower bound
    at_most: float | None = None
    choices: tuple[str, ...] = ()
    shown: str | None = None  # the default as --help and the docs show it, when not str()
    flag: str | None = None  # the flag, when not --<name>


def setting(
    default: Any = dataclasses.MISSING,
    *,
    factory: Callable[[], Any] | None = None,
    **flag: Any,
) -> Any:
    """A field of OperatorConfig with its Flag (see above) in the field's metadata."""
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={"flag": Flag(**flag)})
    return dataclasses.field(default=default, metadata={"flag": Flag(**flag)})


@dataclass(frozen=True)
class OperatorConfig:
    max_reclaims: int = setting(
        3,
        at_least=0,
        help="failed attempts allowed before a task is DeadLettered, when its spec does "
        "not say (maxReclaims); 3 means at most 4 attempts",
    )
    # Exact timers wake the loop earlier for a known lease deadline, so this bounds
    # recovery only when a timer is missed.
    reconcile_interval: float = setting(
        2.0, at_least=0.1, help="the longest the loop sleeps without an event or timer (s)"
    )
    namespaces: tuple[str, ...] = setting(
        (),
        flag="--namespace",
        shown="all",
        help="namespaces to watch (the flag repeated, the variable a comma list)",
    )
    # Bounds the work of one step, and how far decisions run ahead of their writes.
    dispatch_batch: int = setting(256, at_least=1, help="most grants in flight at once")
    # The client's connection pool.
    write_concurrency: int = setting(32, at_least=1, help="API requests in flight at once")
    metrics_port: int = setting(
        8080, at_least=0, at_most=65535, help="Prometheus /metrics on 0.0.0.0:port; 0 disables"
    )
    # Cross-namespace claims' tasks, for their holders' sidecars (claim_api.py); the
    # manifests serve it on 8444 behind a Service and a NetworkPolicy.
    claim_port: int = setting(
        0,
        at_least=0,
        at_most=65535,
        help="the claim API (a cross-namespace claim's task, for its holder) on "
        "0.0.0.0:port; 0 disables",
    )
    # A kubernetes.io/tls Secret's tls.crt and tls.key (claim_tls.py): re-read when the
    # kubelet updates the mounted Secret. Without both the claim port is plain HTTP; one
    # without the other is TLS with nothing to serve (said, never a refusal to start).
    claim_cert_file: str = setting(
        "",
        shown="none: plain HTTP",
        help="PEM certificate (chain) the claim port serves TLS with, re-read when it "
        "changes; with --claim-key-file",
    )
    claim_key_file: str = setting("", shown="none", help="the PEM private key of --claim-cert-file")
    # Off only for a single replica run by hand.
    leader_election: bool = setting(True, shown="on", help="elect a leader among the replicas")
    leader_namespace: str = setting(
        "default", help="where the election Lease and the fencing-token counter live"
    )
    leader_lease: str = setting("agentq-operator", help="the election Lease's name")
    leader_lease_seconds: float = setting(
        15.0,
        at_least=1,
        help="the election Lease's duration: a dead leader is replaced within it (plus one "
        "retry period)",
    )
    # It must be below the lease, else a stale leader decides after the standby took over
    # (check() refuses it); client-go's defaults are 15 / 10.
    leader_renew_seconds: float | None = setting(
        None,
        above=0,
        shown="2/3 of the lease, at most 10",
        help="a leader that could not renew for this long stops deciding (s)",
    )
    leader_retry_seconds: float = setting(
        2.0, above=0, help="how often a standby tries to take the lead, a leader to renew (s)"
    )
    # Worker status is a report for people: it must stay a small fraction of the dispatch
    # writes.
    worker_status_interval: float = setting(
        30.0,
        at_least=0,
        help="least time between two writes of one worker's changed counts (s); a change "
        "of phase or readiness is written at once",
    )
    worker_status_qps: float = setting(
        20.0,
        above=0,
        help="most writes per second of workers' changed phase or readiness, all together",
    )
    # At 100 dispatches a second, one write per 100 dispatches. Status counts are a
    # snapshot; the per-worker metrics follow the scheduling core within a second.
    worker_counts_qps: float = setting(
        1.0,
        above=0,
        help="most writes per second of workers' changed counts alone (in flight, served "
        "cost), all together",
    )
    # AgentQueue status is a report for people too; queues are few (admin-made).
    queue_status_interval: float = setting(
        5.0,
        at_least=0,
        help="least time between two writes of one AgentQueue's changed counts (s); a "
        "change of its conditions is written at once",
    )
    queue_status_qps: float = setting(
        5.0,
        above=0,
        help="most writes per second of AgentQueue statuses, all together (changed "
        "conditions first)",
    )
    # AgentBudget status: a report for people, and the window a new leader resumes from.
    budget_status_interval: float = setting(
        2.0,
        above=0,
        help="least time between two writes of one AgentBudget's status (s): its window "
        "is what a new leader restores from (docs/budgets.md)",
    )
    # A renewal alone never costs a write.
    progress_status_interval: float = setting(
        10.0,
        at_least=0,
        help="least time between two copies of a claim's progress marker into the task's "
        "status (s)",
    )
    # The safety net: every task is decided again this often even if no event or timer
    # asked for it.
    resync_interval: float = setting(300.0, above=0, help="the full re-decision's period (s)")
    # With leader election it must stay below the lease (check()): by default 10 s, or
    # three quarters of a shorter lease. A decision's request is also cut at what is left
    # of the leader's renew deadline (gate.py).
    request_timeout: float | None = setting(
        None,
        above=0,
        shown="10, at most 3/4 of the leader lease",
        help="seconds before an API call's outcome is taken as unknown",
    )
    token_block: int = setting(
        1000, at_least=1, help="fencing tokens reserved per write of the durable counter"
    )
    token_lease: str = setting(
        "agentq-fencing-tokens",
        help="the Lease (in the leader namespace) that holds the fencing-token counter",
    )
    # The event loop running this late means the process was stopped (or starved).
    # For tasks whose spec does not say (ttlSecondsAfterFinished); docs/operator.md has the
    # arithmetic: at 10 completions a second, 12 h is ~430,000 tasks, about 1 GiB of etcd.
    ttl_after_finished: int = setting(
        43200,
        at_least=0,
        at_most=31_536_000,
        help="seconds after a task finished that it is deleted, with its Leases, when its "
        "spec does not say (ttlSecondsAfterFinished, at most a year as there); 0 deletes "
        "at once",
    )
    # The operator's memory for finished tasks: one small entry each, at most this many.
    max_finished: int = setting(
        200_000,
        at_least=1,
        help="finished tasks whose deletion the operator times at once; more are listed "
        "again as the earlier ones go",
    )
    # Also at each resync (agentq_invariant_violations_total; docs/architecture.md).
    invariant_interval: float = setting(
        60.0,
        above=0,
        help="how often (s) the indexes are built afresh from the store and compared "
        "with the live ones",
    )
    stall_seconds: float = setting(
        1.0,
        above=0,
        help="a loop this late (s) gives the time back to every Lease instead of counting it",
    )
    # Holders could not renew either (silence.py).
    api_silence_seconds: float = setting(
        2.0,
        above=0,
        help="a request of ours waiting this long (s) with nothing heard from the API server "
        "gives the time back to every Lease",
    )
    # The watch machinery: informer (default) or kopf, both with watch health and a real
    # synced signal; docs/operator.md says when to pick which.
    watcher: str = setting(
        "informer",
        choices=("informer", "kopf"),
        help="the watch machinery: informer, or kopf's watches (docs/operator.md)",
    )
    identity: str = setting(
        factory=lambda: f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}",
        shown="hostname-pid-random",
        help="this replica's name in the election Lease",
    )

    @property
    def request_seconds(self) -> float:
        """The request timeout in force (see request_timeout)."""
        if self.request_timeout is not None:
            return self.request_timeout
        if not self.leader_election:
            return 10.0
        return min(10.0, self.leader_lease_seconds * 3 / 4)

    @property
    def leader_renew_deadline(self) -> float:
        """The renew deadline in force (see leader_renew_seconds)."""
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
        if self.leader_election and self.request_seconds >= self.leader_lease_seconds:
            raise ValueError(
                f"{env_name('request_timeout')} ({self.request_seconds}s) must be below the "
                f"leader lease ({self.leader_lease_seconds}s): a request may be waited on that "
                "long, and one waited on past the lease would still be ours after a standby "
                "took over (a decision's request is also cut at what is left of the renew "
                'deadline; docs/operator.md, "Leader election")'
            )
        if self.leader_retry_seconds >= self.leader_renew_deadline:
            raise ValueError(
                f"the leader retry period ({self.leader_retry_seconds}s) must be below the renew "
                f"deadline ({self.leader_renew_deadline}s)"
            )
        if not self.api_silence_seconds > 0:
            raise ValueError(f"{env_name('api_silence_seconds')} must be above 0")
        for name in ("worker_status_qps", "worker_counts_qps", "queue_status_qps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{env_name(name)} must be above 0 (writes a second)")
        if self.watcher not in ("informer", "kopf"):
            raise ValueError(f"unknown watcher {self.watcher!r} (informer or kopf)")


def settings() -> list[dataclasses.Field[Any]]:
    """OperatorConfig's fields, in order."""
    return list(dataclasses.fields(OperatorConfig))


def flag_of(field: dataclasses.Field[Any]) -> Flag:
    flag = field.metadata["flag"]
    assert isinstance(flag, Flag)
    return flag


def flag_name(field: dataclasses.Field[Any]) -> str:
    return flag_of(field).flag or "--" + field.name.replace("_", "-")


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def shown_default(field: dataclasses.Field[Any]) -> str:
    """The default as people read it: 2.0 is 2, a tuple or a factory says what it means."""
    flag = flag_of(field)
    if flag.shown is not None:
        return flag.shown
    value = field.default
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
