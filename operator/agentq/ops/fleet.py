"""The fleet at a glance, behind ``agentq top`` and the demo's live view (pure).

``build(tasks, workers, now=...)`` turns the AgentTasks and AgentWorkers of one
or more namespaces (plain dicts from the API server) into a ``FleetView``:

- per worker: phase, weight and its share of the weight of the Ready workers of
  its namespace, its share of the cost served so far (``status.servedCost``,
  cumulative), deficit, in flight / maxInFlight;
- per required-capability set: tasks Pending (and how many wait out a retry
  backoff), the oldest one's age, how many workers could take them and how many
  free slots the Ready ones have (0 capable workers: unschedulable);
- tasks per phase.

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
class FleetView:
    now: datetime.datetime
    phases: dict[str, dict[str, int]]  # namespace -> phase -> count
    workers: tuple[WorkerRow, ...]
    queues: tuple[QueueRow, ...]

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


def build(
    tasks: Iterable[Body],
    workers: Iterable[Body],
    *,
    now: datetime.datetime,
    recent: Mapping[WorkerKey, float] | None = None,
) -> FleetView:
    """The view of these tasks and workers at ``now`` (``recent``: from a ``ShareWindow``).

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
    return FleetView(now=now, phases=ordered, workers=tuple(rows), queues=tuple(queue_rows))


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
