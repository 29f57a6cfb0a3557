"""A watch of every AgentTask of the run that checks invariants on each state it sees.

The API server sends a watch's events in resourceVersion order, so the mirror
kept here passes through the same sequence of states etcd did (a relist after a
dropped watch jumps over the states in between; the gaps are recorded). On every
state it checks:

- no worker holds more Assigned/Running tasks than its ``maxInFlight``;
- no AgentBudget has more Assigned/Running tasks naming it than its ``maxConcurrent``
  (across the run's leader failovers);
- a task's fencing token never goes down;
- a task enters ``Succeeded`` at most once (a second entry is a double commit);

and it records the life of each claim (task, token, worker): when it was first
seen active and when it was first seen over, on the harness's monotonic clock,
for the healthy-claim accounting.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch

from agentq import GROUP, VERSION

ACTIVE = ("Assigned", "Running")
FINAL = ("Succeeded", "Failed", "DeadLettered")


@dataclass
class Claim:
    task: str
    token: int
    worker: str
    first_seen: float
    ended_seen: float | None = None


@dataclass
class _State:
    phase: str | None
    worker: str | None
    token: int | None


@dataclass
class Observations:
    """What the watch saw; read by the harness under ``lock``."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    mirror: dict[str, _State] = field(default_factory=dict)
    in_flight: Counter[str] = field(default_factory=Counter)
    peak_in_flight: Counter[str] = field(default_factory=Counter)
    budget_in_use: Counter[str] = field(default_factory=Counter)
    peak_budget_in_use: Counter[str] = field(default_factory=Counter)
    states_checked: int = 0
    violations: list[str] = field(default_factory=list)
    succeeded_entries: Counter[str] = field(default_factory=Counter)
    claims: dict[tuple[str, int], Claim] = field(default_factory=dict)
    gaps: list[tuple[float, float]] = field(default_factory=list)
    relists: int = 0

    def terminal(self) -> int:
        with self.lock:
            return sum(1 for s in self.mirror.values() if s.phase in FINAL)

    def phases(self) -> Counter[str]:
        with self.lock:
            return Counter(s.phase or "(none)" for s in self.mirror.values())


class TaskWatcher:
    """Runs the watch in a thread; ``stop()`` ends it."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        limits: dict[str, int],
        *,
        budgets: dict[str, str] | None = None,
        budget_limits: dict[str, int] | None = None,
        clock: Any = time.monotonic,
        t0: float = 0.0,
    ) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.limits = limits
        self.budgets = budgets or {}  # task -> the AgentBudget it names
        self.budget_limits = budget_limits or {}  # AgentBudget -> its maxConcurrent
        self.clock = clock
        self.t0 = t0
        self.seen = Observations()
        self._checking = True
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread = threading.Thread(target=self._run, name="task-watcher", daemon=True)

    def now(self) -> float:
        return float(self.clock()) - self.t0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        self._thread.join(timeout=30)

    # -- the loop ------------------------------------------------------------------

    def _run(self) -> None:
        gap_start: float | None = None
        while not self._stop.is_set():
            try:
                listed = self.custom.list_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, "agenttasks"
                )
                if gap_start is not None:
                    self.seen.gaps.append((gap_start, self.now()))
                    gap_start = None
                self._relist(listed["items"])
                version = listed["metadata"]["resourceVersion"]
                while not self._stop.is_set():
                    version = self._stream(version)
                    if version is None:
                        break  # expired or failed: list again
            except Exception:
                if gap_start is None:
                    gap_start = self.now()
                time.sleep(0.5)

    def _stream(self, version: str) -> str | None:
        self._watch = watch.Watch()
        for event in self._watch.stream(
            self.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            "agenttasks",
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=20,
        ):
            if self._stop.is_set():
                return None
            kind, body = event["type"], event["object"]
            if kind == "ERROR":
                return None
            version = body["metadata"]["resourceVersion"]
            if kind == "BOOKMARK":
                continue
            with self.seen.lock:
                if kind == "DELETED":
                    self._apply(body["metadata"]["name"], None)
                else:
                    self._apply(body["metadata"]["name"], body.get("status") or {})
        return version

    def _relist(self, items: list[dict[str, Any]]) -> None:
        # A list is one consistent snapshot, but applying it object by object would pass
        # through mixtures of old and new states that never existed: check the snapshot
        # as a whole instead.
        with self.seen.lock:
            self.seen.relists += 1
            names = set()
            self._checking = False
            try:
                for body in items:
                    name = body["metadata"]["name"]
                    names.add(name)
                    self._apply(name, body.get("status") or {})
                for name in set(self.seen.mirror) - names:
                    self._apply(name, None)
            finally:
                self._checking = True
            for worker, count in self.seen.in_flight.items():
                self._check_limit(worker, count)
            for budget, count in self.seen.budget_in_use.items():
                self._check_budget(budget, count)

    # -- one state -----------------------------------------------------------------

    def _check_limit(self, worker: str, count: int) -> None:
        seen = self.seen
        seen.peak_in_flight[worker] = max(seen.peak_in_flight[worker], count)
        limit = self.limits.get(worker)
        if limit is not None and count > limit:
            held = sorted(
                f"{n}@{s.token}"
                for n, s in seen.mirror.items()
                if s.worker == worker and s.phase in ACTIVE
            )
            seen.violations.append(
                f"maxInFlight: {worker} held {count} tasks (limit {limit}) at {self.now():.1f}s: "
                f"{', '.join(held)}"
            )

    def _check_budget(self, budget: str, count: int) -> None:
        seen = self.seen
        seen.peak_budget_in_use[budget] = max(seen.peak_budget_in_use[budget], count)
        limit = self.budget_limits.get(budget)
        if limit is not None and count > limit:
            held = sorted(
                f"{n}@{s.token}"
                for n, s in seen.mirror.items()
                if self.budgets.get(n) == budget and s.phase in ACTIVE and s.worker
            )
            seen.violations.append(
                f"maxConcurrent: AgentBudget {budget} had {count} claims (limit {limit}) at "
                f"{self.now():.1f}s: {', '.join(held)}"
            )

    def _apply(self, name: str, status: dict[str, Any] | None) -> None:
        seen = self.seen
        now = self.now()
        before = seen.mirror.get(name)
        if status is None:
            after = None
            seen.mirror.pop(name, None)
        else:
            token = status.get("fencingToken")
            after = _State(
                phase=status.get("phase"),
                worker=status.get("worker"),
                token=token if isinstance(token, int) else None,
            )
            seen.mirror[name] = after
        seen.states_checked += 1
        was_active = before is not None and before.phase in ACTIVE and before.worker
        is_active = after is not None and after.phase in ACTIVE and after.worker
        budget = self.budgets.get(name)
        if was_active:
            assert before is not None and before.worker is not None
            seen.in_flight[before.worker] -= 1
            if budget is not None:
                seen.budget_in_use[budget] -= 1
            if before.token is not None and not (
                is_active and after is not None and after.token == before.token
            ):
                claim = seen.claims.get((name, before.token))
                if claim is not None and claim.ended_seen is None:
                    claim.ended_seen = now
        if is_active:
            assert after is not None and after.worker is not None
            worker = after.worker
            seen.in_flight[worker] += 1
            if budget is not None:
                seen.budget_in_use[budget] += 1
            if self._checking:
                self._check_limit(worker, seen.in_flight[worker])
                if budget is not None:
                    self._check_budget(budget, seen.budget_in_use[budget])
            if after.token is not None and (name, after.token) not in seen.claims:
                seen.claims[(name, after.token)] = Claim(name, after.token, worker, now)
        if before is not None and after is not None:
            if before.token is not None and after.token is not None and after.token < before.token:
                seen.violations.append(
                    f"token of {name} went down from {before.token} to {after.token} at {now:.1f}s"
                )
            if after.phase == "Succeeded" and before.phase != "Succeeded":
                seen.succeeded_entries[name] += 1
        elif before is None and after is not None and after.phase == "Succeeded":
            seen.succeeded_entries[name] += 1
        if seen.succeeded_entries[name] > 1 and after is not None and after.phase == "Succeeded":
            seen.violations.append(f"{name} entered Succeeded {seen.succeeded_entries[name]} times")
