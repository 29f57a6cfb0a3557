"""The policies agentq's DRR is measured against, and the interface they all share.

Both baselines count tasks, not cost, and ignore weights -- what a plain work
queue does. They obey the same eligibility as the DRR core (ready, not paused,
below ``max_in_flight``, capabilities covering the task) so that the comparison
is about the choice among eligible workers and nothing else.

- :class:`RoundRobin`: the next eligible worker after the last one chosen, in
  name order.
- :class:`LeastLoaded`: the eligible worker with the fewest tasks in flight
  (ties by name).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from agentq.scheduler import Assignment, Scheduler, TaskSpec, WorkerSpec

__all__ = ["POLICIES", "LeastLoaded", "Policy", "RoundRobin"]


class Policy(Protocol):
    """What the simulator needs of a dispatch policy (a subset of the core's API)."""

    def upsert_worker(self, spec: WorkerSpec) -> None: ...

    def plan(self, tasks: Sequence[TaskSpec]) -> list[Assignment]: ...

    def release(self, task: str, *, completed: bool) -> None: ...


class _CountingPolicy:
    """Bookkeeping shared by the baselines: specs and the tasks each worker holds."""

    def __init__(self) -> None:
        self._specs: dict[str, WorkerSpec] = {}
        self._order: list[str] = []
        self._held: dict[str, set[str]] = {}
        self._holder: dict[str, str] = {}

    def upsert_worker(self, spec: WorkerSpec) -> None:
        if spec.name not in self._specs:
            self._order = sorted([*self._order, spec.name])
            self._held[spec.name] = set()
        self._specs[spec.name] = spec

    def release(self, task: str, *, completed: bool) -> None:
        worker = self._holder.pop(task, None)
        if worker is not None:
            self._held[worker].discard(task)

    def _eligible(self, name: str, task: TaskSpec) -> bool:
        spec = self._specs[name]
        return (
            spec.active
            and len(self._held[name]) < spec.max_in_flight
            and task.required <= spec.capabilities
        )

    def _choose(self, task: TaskSpec) -> str | None:
        raise NotImplementedError

    def plan(self, tasks: Sequence[TaskSpec]) -> list[Assignment]:
        decisions = []
        for task in tasks:
            name = self._choose(task)
            if name is not None:
                self._held[name].add(task.name)
                self._holder[task.name] = name
                decisions.append(Assignment(task.name, name, task.cost))
        return decisions


class RoundRobin(_CountingPolicy):
    """Plain round-robin by count: the next eligible worker in a fixed rotation."""

    def __init__(self) -> None:
        super().__init__()
        self._last = -1

    def _choose(self, task: TaskSpec) -> str | None:
        count = len(self._order)
        for step in range(1, count + 1):
            index = (self._last + step) % count
            if self._eligible(self._order[index], task):
                self._last = index
                return self._order[index]
        return None


class LeastLoaded(_CountingPolicy):
    """Least-loaded by count: the eligible worker with the fewest tasks in flight."""

    def _choose(self, task: TaskSpec) -> str | None:
        candidates = [name for name in self._order if self._eligible(name, task)]
        if not candidates:
            return None
        return min(candidates, key=lambda name: (len(self._held[name]), name))


#: The policies a simulation compares, by the name shown in its table.
POLICIES: dict[str, Callable[[], Policy]] = {
    "drr": Scheduler,
    "round-robin": RoundRobin,
    "least-loaded": LeastLoaded,
}
