"""The fleet at a glance, behind ``agentq top`` and the demo's live view (pure).

``build(tasks, workers, now=...)`` turns the AgentTasks and AgentWorkers of one
or more namespaces (plain dicts from the API server) into a ``FleetView``:

- per worker: phase, weight and its share of the weight of the Ready workers of
  its namespace, its share of the cost served so far (``status.servedCost``,
  cumulative), deficit, in flight / maxInFlight;
- per required-capability set: tasks Pending (and how many wait out a retry
  backoff), the oldest one's age, how many workers could take them and how many
  free slots the Ready ones have (0 capable workers: unschedulable);
- tasks per phase;
- per AgentQueue (cluster-scoped; when any exists): its parent, weight and
  weight share, share of the cost granted, pending, in flight / maxInFlight,
  served cost and readiness, from the queue's status as the operator writes it
  (a snapshot at most ``QUEUE_STATUS_INTERVAL`` old), with an estimated wait in
  the live view (``RateWindow``).

``ShareWindow`` keeps successive snapshots of served cost so a live view can
show each worker's share of the cost served in the last minute, which is what
converges to the weight share while the fleet is saturated (the cumulative
share also carries everything before).
"""

from __future__ import annotations

import datetime
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentq.clock import parse_time, rfc3339

Body = Mapping[str, Any]
WorkerKey = tuple[str, str]  # (namespace, name)
PHASE_ORDER = ("Pending", "Assigned", "Running", "Succeeded", "Failed", "DeadLettered", "Held")


@dataclass(frozen=True)
class WorkerRow:
    namespace: str
    name: str
    phase: str
    paused: bool
    capabilities: tuple[str, ...]
    weight: float
    weight_share: float | None  # of the Ready, unpaused workers' weight; None if not one
    served_cost: float
    served_share: float | None  # of the namespace's served cost; None if nothing served
    recent_share: float | None  # of the cost served in the live view's window
    deficit: float | None
    in_flight: int
    max_in_flight: int
    in_flight_cost: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "name": self.name,
            "phase": self.phase,
            "paused": self.paused,
            "capabilities": list(self.capabilities),
            "weight": self.weight,
            "weightShare": _r(self.weight_share),
            "servedCost": _r(self.served_cost),
            "servedShare": _r(self.served_share),
            "recentShare": _r(self.recent_share),
            "deficit": _r(self.deficit),
            "inFlight": self.in_flight,
            "maxInFlight": self.max_in_flight,
            "inFlightCost": _r(self.in_flight_cost),
        }


@dataclass(frozen=True)
class QueueRow:
    namespace: str
    capabilities: tuple[str, ...]
    pending: int
    backoff: int  # of which wait out a retry backoff (notBefore in the future)
    oldest_seconds: float | None
    capable_workers: int
    ready_workers: int
    free_slots: int

    @property
    def unschedulable(self) -> bool:
        return self.capable_workers == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "capabilities": list(self.capabilities),
            "pending": self.pending,
            "backoff": self.backoff,
            "oldestSeconds": _r(self.oldest_seconds),
            "capableWorkers": self.capable_workers,
            "readyWorkers": self.ready_workers,
            "freeSlots": self.free_slots,
            "unschedulable": self.unschedulable,
        }


@dataclass(frozen=True)
class AgentQueueRow:
    name: str
    parent: str | None
    depth: int  # 0: top level (or its parent chain is broken)
    weight: float
    weight_share: float | None  # status.weightShare
    share: float | None  # status.share: since the operator's leader started
    pending: int
    in_flight: int
    max_in_flight: int | None
    served_cost: float
    state: str  # "Ready", else the reason of its Ready condition ("-": none yet)
    wait_seconds: float | None  # estimated: pending cost / recent served-cost rate

    @property
    def capped(self) -> bool:
        return self.max_in_flight is not None and self.in_flight >= self.max_in_flight

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "parent": self.parent,
            "weight": self.weight,
            "weightShare": _r(self.weight_share),
            "share": _r(self.share),
            "pending": self.pending,
            "inFlight": self.in_flight,
            "maxInFlight": self.max_in_flight,
            "servedCost": _r(self.served_cost),
            "state": self.state,
            "estimatedWaitSeconds": _r(self.wait_seconds),
        }


@dataclass(frozen=True)
class AgentBudgetRow:
    """One AgentBudget, as its spec and the status the operator's leader writes say."""

    name: str
    requests_per_minute: int | None
    tokens_per_minute: int | None
    max_concurrent: int | None
    in_use: int | None
    used_requests: int | None
    used_tokens: int | None
    reserved_requests: int | None
    reserved_tokens: int | None
    waiting: int | None
    throttled_until: str | None
    saturated: str | None  # the reason of Saturated when True, else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "requestsPerMinute": self.requests_per_minute,
            "tokensPerMinute": self.tokens_per_minute,
            "maxConcurrent": self.max_concurrent,
            "inUse": self.in_use,
            "usedRequests": self.used_requests,
            "usedTokens": self.used_tokens,
            "reservedRequests": self.reserved_requests,
            "reservedTokens": self.reserved_tokens,
            "waiting": self.waiting,
            "throttledUntil": self.throttled_until,
            "saturated": self.saturated,
        }


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _agent_budgets(bodies: Iterable[Body]) -> tuple[AgentBudgetRow, ...]:
    rows = []
    for body in sorted(bodies, key=_name):
        spec, status = body.get("spec") or {}, body.get("status") or {}
        saturated = next(
            (
                str(c.get("reason") or "")
                for c in status.get("conditions") or []
                if isinstance(c, dict)
                and c.get("type") == "Saturated"
                and c.get("status") == "True"
            ),
            None,
        )
        throttled = status.get("throttledUntil")
        rows.append(
            AgentBudgetRow(
                name=_name(body),
                requests_per_minute=_int(spec.get("requestsPerMinute")),
                tokens_per_minute=_int(spec.get("tokensPerMinute")),
                max_concurrent=_int(spec.get("maxConcurrent")),
                in_use=_int(status.get("inUse")),
                used_requests=_int(status.get("usedRequests")),
                used_tokens=_int(status.get("usedTokens")),
                reserved_requests=_int(status.get("reservedRequests")),
                reserved_tokens=_int(status.get("reservedTokens")),
                waiting=_int(status.get("waiting")),
                throttled_until=str(throttled) if throttled else None,
                saturated=saturated,
            )
        )
    return tuple(rows)


@dataclass(frozen=True)
class FleetView:
    now: datetime.datetime
    phases: dict[str, dict[str, int]]  # namespace -> phase -> count
    workers: tuple[WorkerRow, ...]
    queues: tuple[QueueRow, ...]
    agent_queues: tuple[AgentQueueRow, ...] = ()
    # Why the AgentQueues are not shown (listing them was forbidden); None: they are.
    agent_queues_note: str | None = None
    agent_budgets: tuple[AgentBudgetRow, ...] = ()

    @property
    def namespaces(self) -> list[str]:
        names = set(self.phases) | {w.namespace for w in self.workers}
        return sorted(names)

    def totals(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for counts in self.phases.values():
            total.update(counts)
        return total

    def to_dict(self) -> dict[str, Any]:
        return {
            "time": rfc3339(self.now),
            "phases": self.phases,
            "workers": [w.to_dict() for w in self.workers],
            "queues": [q.to_dict() for q in self.queues],
            "agentQueues": [q.to_dict() for q in self.agent_queues],
            "agentQueuesNote": self.agent_queues_note,
            "agentBudgets": [b.to_dict() for b in self.agent_budgets],
        }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _num(value: Any, default: float) -> float:
    return (
        float(value) if isinstance(value, int | float) and not isinstance(value, bool) else default
    )


def _ns(body: Body) -> str:
    return str((body.get("metadata") or {}).get("namespace") or "default")


def _name(body: Body) -> str:
    return str((body.get("metadata") or {}).get("name") or "?")


@dataclass
class _Worker:
    namespace: str
    name: str
    capabilities: frozenset[str]
    weight: float
    max_in_flight: int
    paused: bool
    phase: str
    status: Mapping[str, Any]

    @property
    def available(self) -> bool:
        return self.phase == "Ready" and not self.paused


def _workers(bodies: Iterable[Body]) -> list[_Worker]:
    out = []
    for body in bodies:
        spec = body.get("spec") or {}
        status = body.get("status") or {}
        paused = bool(spec.get("paused", False))
        out.append(
            _Worker(
                namespace=_ns(body),
                name=_name(body),
                capabilities=frozenset(str(c) for c in spec.get("capabilities") or ()),
                weight=_num(spec.get("weight"), 1.0),
                max_in_flight=int(_num(spec.get("maxInFlight"), 1)),
                paused=paused,
                phase=str(status.get("phase") or ("Draining" if paused else "Unknown")),
                status=status,
            )
        )
    return sorted(out, key=lambda w: (w.namespace, w.name))


FORBIDDEN_QUEUES = (
    "AgentQueues not shown: listing agentqueues (cluster-scoped) is forbidden to you; "
    "ask for get/list on them through a ClusterRole (docs/cli.md#permissions)"
)


def _agent_queues(
    bodies: Iterable[Body], tasks: list[Body], rates: Mapping[str, float]
) -> tuple[AgentQueueRow, ...]:
    """One row per AgentQueue, parents before their children (a tree in name order)."""
    queues = {_name(q): q for q in bodies}
    parent_of = {name: ((q.get("spec") or {}).get("parent") or None) for name, q in queues.items()}

    def path(name: str) -> tuple[str, ...]:
        out = [name]
        parent = parent_of.get(name)
        while parent is not None and parent in queues and parent not in out:
            out.append(parent)
            parent = parent_of.get(parent)
        return tuple(reversed(out))

    # The cost of a pending task, on average, per queue named: an estimate for those not
    # listed (another namespace, or no -A).
    costs: defaultdict[str, list[float]] = defaultdict(list)
    for task in tasks:
        spec = task.get("spec") or {}
        if spec.get("queue") and str((task.get("status") or {}).get("phase") or "Pending") == (
            "Pending"
        ):
            costs[str(spec["queue"])].append(_num(spec.get("cost"), 1.0))
    paths = {name: path(name) for name in queues}
    rows = []
    for name in sorted(queues, key=paths.__getitem__):
        body = queues[name]
        spec, status = body.get("spec") or {}, body.get("status") or {}
        trail = paths[name]
        # Its own pending tasks' costs and those of every queue below it.
        under = [cost for q in queues if name in paths[q] for cost in costs[q]]
        pending = int(_num(status.get("pending"), 0))
        rate = rates.get(name)
        mean = sum(under) / len(under) if under else 1.0
        cap = spec.get("maxInFlight")
        ready = next((c for c in status.get("conditions") or () if c.get("type") == "Ready"), None)
        state = "-"
        if ready is not None:
            state = "Ready" if ready.get("status") == "True" else str(ready.get("reason") or "?")
        rows.append(
            AgentQueueRow(
                name=name,
                parent=parent_of[name],
                depth=len(trail) - 1,
                weight=_num(spec.get("weight"), 1.0),
                weight_share=_opt(status.get("weightShare")),
                share=_opt(status.get("share")),
                pending=pending,
                in_flight=int(_num(status.get("inFlight"), 0)),
                max_in_flight=int(cap) if isinstance(cap, int) else None,
                served_cost=_num(status.get("servedCost"), 0.0),
                state=state,
                wait_seconds=pending * mean / rate if pending and rate else None,
            )
        )
    return tuple(rows)


def _opt(value: Any) -> float | None:
    return _num(value, 0.0) if isinstance(value, int | float) else None


def build(
    tasks: Iterable[Body],
    workers: Iterable[Body],
    *,
    now: datetime.datetime,
    recent: Mapping[WorkerKey, float] | None = None,
    agent_queues: Iterable[Body] | None = (),
    queue_rates: Mapping[str, float] | None = None,
    agent_budgets: Iterable[Body] | None = (),
) -> FleetView:
    """The view of these tasks and workers at ``now`` (``recent``: from a ``ShareWindow``),
    and of the AgentQueues (``agent_queues`` None: they could not be listed;
    ``queue_rates``: each queue's served cost per second, from a ``RateWindow``).

    In flight comes from the tasks (Assigned or Running on the worker: always current);
    served cost and deficit from the worker's status, which the operator writes as a
    rate-limited snapshot.
    """
    tasks = list(tasks)
    fleet = _workers(workers)
    held: defaultdict[WorkerKey, list[float]] = defaultdict(list)
    for task in tasks:
        status = task.get("status") or {}
        if status.get("phase") in ("Assigned", "Running") and status.get("worker"):
            cost = _num((task.get("spec") or {}).get("cost"), 1.0)
            held[(_ns(task), str(status["worker"]))].append(cost)
    weight_total: defaultdict[str, float] = defaultdict(float)
    served_total: defaultdict[str, float] = defaultdict(float)
    for w in fleet:
        if w.available:
            weight_total[w.namespace] += w.weight
        served_total[w.namespace] += _num(w.status.get("servedCost"), 0.0)
    rows = []
    for w in fleet:
        served = _num(w.status.get("servedCost"), 0.0)
        deficit = w.status.get("deficit")
        rows.append(
            WorkerRow(
                namespace=w.namespace,
                name=w.name,
                phase=w.phase,
                paused=w.paused,
                capabilities=tuple(sorted(w.capabilities)),
                weight=w.weight,
                weight_share=(
                    w.weight / weight_total[w.namespace]
                    if w.available and weight_total[w.namespace]
                    else None
                ),
                served_cost=served,
                served_share=(
                    served / served_total[w.namespace] if served_total[w.namespace] else None
                ),
                recent_share=(recent or {}).get((w.namespace, w.name)),
                deficit=_num(deficit, 0.0) if deficit is not None else None,
                in_flight=len(held[(w.namespace, w.name)]),
                max_in_flight=w.max_in_flight,
                in_flight_cost=sum(held[(w.namespace, w.name)]),
            )
        )

    phases: dict[str, Counter[str]] = {}
    queues: dict[tuple[str, tuple[str, ...]], list[tuple[float | None, bool]]] = {}
    for task in tasks:
        namespace = _ns(task)
        status = task.get("status") or {}
        phase = str(status.get("phase") or "Pending")
        phases.setdefault(namespace, Counter())[phase] += 1
        if phase != "Pending":
            continue
        caps = tuple(
            sorted(str(c) for c in (task.get("spec") or {}).get("requiredCapabilities") or ())
        )
        created = parse_time((task.get("metadata") or {}).get("creationTimestamp"))
        age = (now - created).total_seconds() if created is not None else None
        not_before = parse_time(status.get("notBefore"))
        waiting = not_before is not None and not_before > now
        queues.setdefault((namespace, caps), []).append((age, waiting))

    queue_rows = []
    for (namespace, caps), entries in sorted(queues.items()):
        required = frozenset(caps)
        capable = [w for w in fleet if w.namespace == namespace and required <= w.capabilities]
        ready = [w for w in capable if w.available]
        ages = [age for age, _ in entries if age is not None]
        queue_rows.append(
            QueueRow(
                namespace=namespace,
                capabilities=caps,
                pending=len(entries),
                backoff=sum(1 for _, waiting in entries if waiting),
                oldest_seconds=max(ages) if ages else None,
                capable_workers=len(capable),
                ready_workers=len(ready),
                free_slots=sum(
                    max(0, w.max_in_flight - len(held[(w.namespace, w.name)])) for w in ready
                ),
            )
        )
    ordered = {
        ns: {p: counts[p] for p in (*PHASE_ORDER, *sorted(counts)) if counts.get(p)}
        for ns, counts in sorted(phases.items())
    }
    return FleetView(
        now=now,
        phases=ordered,
        workers=tuple(rows),
        queues=tuple(queue_rows),
        agent_queues=_agent_queues(agent_queues or (), tasks, queue_rates or {}),
        agent_queues_note=FORBIDDEN_QUEUES if agent_queues is None else None,
        agent_budgets=_agent_budgets(agent_budgets or ()),
    )


@dataclass
class ShareWindow:
    """Each worker's share of the cost served over the last ``seconds`` (per namespace).

    Fed with ``(monotonic time, {(namespace, worker): servedCost})`` snapshots; the
    share is the served-cost increase of each worker since the oldest snapshot still
    inside the window, over the namespace's total increase.
    """

    seconds: float = 60.0
    _samples: deque[tuple[float, dict[WorkerKey, float]]] = field(default_factory=deque)

    def add(self, at: float, served: Mapping[WorkerKey, float]) -> None:
        self._samples.append((at, dict(served)))
        while len(self._samples) > 2 and self._samples[1][0] <= at - self.seconds:
            self._samples.popleft()

    def add_workers(self, at: float, workers: Iterable[Body]) -> None:
        self.add(
            at,
            {
                (_ns(w), _name(w)): _num((w.get("status") or {}).get("servedCost"), 0.0)
                for w in workers
            },
        )

    def shares(self) -> dict[WorkerKey, float]:
        if len(self._samples) < 2:
            return {}
        (_, old), (_, new) = self._samples[0], self._samples[-1]
        delta = {key: max(0.0, value - old.get(key, 0.0)) for key, value in new.items()}
        per_ns: defaultdict[str, float] = defaultdict(float)
        for (namespace, _), value in delta.items():
            per_ns[namespace] += value
        return {key: value / per_ns[key[0]] for key, value in delta.items() if per_ns[key[0]] > 0}


@dataclass
class RateWindow:
    """Each AgentQueue's served cost per second over the last ``seconds``.

    Fed with ``(monotonic time, AgentQueues)`` snapshots; the rate is the increase of
    ``status.servedCost`` since the oldest snapshot still inside the window over the
    time between them. The operator writes a queue's counts at most every
    ``QUEUE_STATUS_INTERVAL`` (5 s), so a rate needs a window longer than that.
    """

    seconds: float = 60.0
    _samples: deque[tuple[float, dict[str, float]]] = field(default_factory=deque)

    def add(self, at: float, queues: Iterable[Body]) -> None:
        served = {_name(q): _num((q.get("status") or {}).get("servedCost"), 0.0) for q in queues}
        self._samples.append((at, served))
        while len(self._samples) > 2 and self._samples[1][0] <= at - self.seconds:
            self._samples.popleft()

    def rates(self) -> dict[str, float]:
        if len(self._samples) < 2:
            return {}
        (then, old), (now, new) = self._samples[0], self._samples[-1]
        if now <= then:
            return {}
        return {
            name: max(0.0, value - old[name]) / (now - then)
            for name, value in new.items()
            if name in old
        }
