"""A discrete-event simulation of a fleet working through a workload under one policy.

The simulated world, kept as simple as the questions asked of it allow:

- tasks arrive at their workload times and wait in one queue, in arrival order
  (a reclaimed task goes back to its original place);
- whenever something happens, the dispatcher offers the policy the queued tasks
  some free worker could take, in queue order, as the operator does;
- a worker works off the cost of the tasks it holds at its ``speed``, by the
  scenario's ``execution`` model: ``shared`` (the default) -- all of them at
  once, sharing the speed equally (``max_in_flight`` concurrent tasks on an
  agent bounded by its CPU or its model API's rate limit); ``serial`` -- one
  task at a time, in grant order, the others waiting at the worker (an agent
  that takes its next assignment when it is done, ``max_in_flight`` being its
  backlog); ``slots`` -- all of them at once, each at full speed (tasks that do
  not contend at all). A finished task's cost counts as the worker's service;
- a worker that crashes stops silently: nothing it holds completes; its task
  leases expire ``lease_seconds`` after the crash (or after a later grant) and
  the tasks are reclaimed and queued again; its worker lease expires at the
  same time, after which the policy sees it not ready.

A task's *queue wait* is the time from its arrival (or its reclaim) until a
worker starts working on it -- in the central queue and, with ``serial``, at
the worker. Time is simulated; nothing here reads a clock.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import dataclass, field, replace

from agentq.scheduler import TaskSpec, WorkerSpec
from agentq.simulation.baselines import Policy
from agentq.simulation.scenario import Scenario, WorkerConfig
from agentq.simulation.workload import SimTask

__all__ = ["Run", "WorkerOutcome", "simulate"]

# Same-time events are handled in this order: a crash and the expiry of the
# crashed worker's lease first (so nothing is re-dispatched to a dead worker),
# then completions, reclaims, and arrivals.
_CRASH, _DETECT, _COMPLETE, _RECLAIM, _ARRIVE = range(5)
# How many queued tasks the dispatcher offers the policy in one batch.
_BATCH = 64

_PENDING, _GRANTED, _DONE = range(3)


@dataclass(frozen=True)
class WorkerOutcome:
    """What one worker did over the run."""

    name: str
    weight: float
    uptime: float  # seconds it was alive, up to the makespan
    served: float  # cost of the tasks it completed
    completed: int
    timeline: tuple[tuple[float, float], ...]  # (time, cumulative served) per completion


@dataclass(frozen=True)
class Run:
    """The raw outcome of one policy on one workload."""

    policy: str
    workers: tuple[WorkerOutcome, ...]
    waits: tuple[float, ...]  # per task that started: its total queue wait (s)
    makespan: float  # time of the last completion
    starved: int  # tasks never dispatched
    unfinished: int  # tasks dispatched at least once but not completed at the end
    reclaims: int
    max_cost: float  # the largest task cost of the workload


@dataclass
class _Task:
    sim: SimTask
    index: int
    status: int = _PENDING
    attempt: int = 0
    worker: str = ""
    waiting_since: float = 0.0
    waited: float = 0.0
    executing: bool = False  # a worker has started on the current attempt
    dispatched: bool = False
    started: bool = False


@dataclass
class _Worker:
    config: WorkerConfig
    spec: WorkerSpec
    held: int = 0
    crashed_at: float | None = None
    served: float = 0.0
    completed: int = 0
    timeline: list[tuple[float, float]] = field(default_factory=list)
    # Granted tasks (index -> work left), in grant order.
    running: dict[int, float] = field(default_factory=dict)
    updated: float = 0.0  # when ``running`` was last brought up to date
    epoch: int = 0  # completion events of older epochs are stale

    @property
    def free(self) -> bool:
        return self.spec.ready and self.held < self.spec.max_in_flight


class _Simulation:
    def __init__(self, scenario: Scenario, workload: list[SimTask], policy: Policy) -> None:
        self.scenario = scenario
        self.serial = scenario.execution == "serial"
        self.policy = policy
        self.tasks = [
            _Task(sim, index, waiting_since=sim.arrival) for index, sim in enumerate(workload)
        ]
        self.workers: dict[str, _Worker] = {}
        for config in scenario.workers:
            spec = WorkerSpec(
                name=config.name,
                capabilities=config.capabilities,
                weight=config.weight,
                max_in_flight=config.max_in_flight,
            )
            self.workers[config.name] = _Worker(config, spec)
            policy.upsert_worker(spec)
        # Queued task indexes per requirement, each list in queue (arrival) order.
        self.queues: dict[frozenset[str], list[int]] = {}
        # (time, kind, sequence, task index, attempt or epoch, worker name)
        self.events: list[tuple[float, int, int, int, int, str]] = []
        self.sequence = 0
        self.now = 0.0
        self.makespan = 0.0
        self.reclaims = 0

    def at(
        self, time: float, kind: int, *, index: int = -1, attempt: int = 0, worker: str = ""
    ) -> None:
        self.sequence += 1
        heapq.heappush(self.events, (time, kind, self.sequence, index, attempt, worker))

    def arrive_at(self, index: int, time: float) -> None:
        """Task ``index`` arrives at ``time`` (its wait counts from then)."""
        self.tasks[index].waiting_since = time
        self.at(time, _ARRIVE, index=index)

    def schedule_arrivals(self) -> None:
        """When the tasks arrive: at their workload times (a subclass may decide later)."""
        for task in self.tasks:
            self.arrive_at(task.index, task.sim.arrival)

    def run(self) -> None:
        self.schedule_arrivals()
        for worker in self.workers.values():
            if worker.config.crash_at is not None:
                self.at(worker.config.crash_at, _CRASH, worker=worker.config.name)
        while self.events:
            self.now = self.events[0][0]
            while self.events and self.events[0][0] == self.now:
                _, kind, _, index, attempt, name = heapq.heappop(self.events)
                self.handle(kind, index, attempt, name)
            self.dispatch()

    def handle(self, kind: int, index: int, attempt: int, name: str) -> None:
        if kind == _ARRIVE:
            self.enqueue(self.tasks[index])
        elif kind == _COMPLETE:
            worker = self.workers[name]
            if attempt == worker.epoch and worker.crashed_at is None:
                self.complete_next(worker)
        elif kind == _RECLAIM:
            task = self.tasks[index]
            if task.status != _GRANTED or task.attempt != attempt:
                return
            self.workers[task.worker].held -= 1
            self.reclaims += 1
            self.policy.release(task.sim.name, completed=False)
            self.enqueue(task)
        elif kind == _CRASH:
            worker = self.workers[name]
            worker.crashed_at = self.now
            worker.epoch += 1  # nothing it holds will complete
            lease = self.scenario.lease_seconds
            for task_index in worker.running:
                task = self.tasks[task_index]
                self.at(self.now + lease, _RECLAIM, index=task_index, attempt=task.attempt)
            worker.running.clear()
            self.at(self.now + lease, _DETECT, worker=name)
        elif kind == _DETECT:
            worker = self.workers[name]
            worker.spec = replace(worker.spec, ready=False)
            self.policy.upsert_worker(worker.spec)

    # -- the central queue -----------------------------------------------------------------

    def enqueue(self, task: _Task) -> None:
        task.status = _PENDING
        if task.executing:  # a reclaimed attempt that had started: waiting again from now
            task.executing = False
            task.waiting_since = self.now
        queue = self.queues.setdefault(task.sim.required, [])
        bisect.insort(queue, task.index)

    def dispatch(self) -> None:
        while True:
            free = {w.spec.capabilities for w in self.workers.values() if w.free}
            if not free:
                return
            open_queues = [
                queue
                for required, queue in self.queues.items()
                if queue and any(required <= capabilities for capabilities in free)
            ]
            if not open_queues:
                return
            batch = sorted(i for queue in open_queues for i in queue[:_BATCH])[:_BATCH]
            offered = [self.tasks[i].sim for i in batch]
            decisions = self.policy.plan([TaskSpec(t.name, t.required, t.cost) for t in offered])
            if not decisions:
                return  # cannot happen while the policy sees what we see; never spin
            by_name = {self.tasks[i].sim.name: self.tasks[i] for i in batch}
            for decision in decisions:
                self.grant(by_name[decision.task], self.workers[decision.worker])
            for queue in open_queues:
                queue[:_BATCH] = [i for i in queue[:_BATCH] if self.tasks[i].status == _PENDING]

    def grant(self, task: _Task, worker: _Worker) -> None:
        task.status = _GRANTED
        task.attempt += 1
        task.worker = worker.config.name
        task.dispatched = True
        worker.held += 1
        self.granted(task)
        if worker.crashed_at is not None:  # a dead worker whose lease has not expired yet
            lease = self.scenario.lease_seconds
            self.at(self.now + lease, _RECLAIM, index=task.index, attempt=task.attempt)
            return
        self.bring_up_to_date(worker)
        worker.running[task.index] = task.sim.cost
        self.schedule_next_completion(worker)

    # -- execution on a worker -------------------------------------------------------------

    def executing(self, worker: _Worker) -> list[int]:
        """The tasks ``worker`` is working on now."""
        if self.serial:
            return [next(iter(worker.running))] if worker.running else []
        return list(worker.running)

    def task_speed(self, worker: _Worker) -> float:
        if self.scenario.execution == "shared":
            return worker.config.rate / len(worker.running)
        return worker.config.rate

    def bring_up_to_date(self, worker: _Worker) -> None:
        if worker.running:
            done = (self.now - worker.updated) * self.task_speed(worker)
            for task_index in self.executing(worker):
                worker.running[task_index] -= done
        worker.updated = self.now

    def schedule_next_completion(self, worker: _Worker) -> None:
        worker.epoch += 1
        executing = self.executing(worker)
        for task_index in executing:
            task = self.tasks[task_index]
            if not task.executing:
                task.executing = True
                task.started = True
                task.waited += self.now - task.waiting_since
        if executing:
            left = min(worker.running[i] for i in executing)
            when = self.now + max(left, 0.0) / self.task_speed(worker)
            self.at(when, _COMPLETE, attempt=worker.epoch, worker=worker.config.name)

    def complete_next(self, worker: _Worker) -> None:
        self.bring_up_to_date(worker)
        # The task with the least work left is the one due now (exactly, up to rounding).
        task_index = min(self.executing(worker), key=lambda i: (worker.running[i], i))
        del worker.running[task_index]
        task = self.tasks[task_index]
        task.status = _DONE
        worker.held -= 1
        worker.served += task.sim.cost
        worker.completed += 1
        worker.timeline.append((self.now, worker.served))
        self.makespan = self.now
        self.policy.release(task.sim.name, completed=True)
        self.completed(task)
        self.schedule_next_completion(worker)

    # -- hooks for a subclass (the tenants simulation) ---------------------------------------

    def granted(self, task: _Task) -> None:
        """``task`` was just granted (``task.worker`` holds it)."""

    def completed(self, task: _Task) -> None:
        """``task`` just completed."""

    def outcome(self, policy: str) -> Run:
        workers = []
        for worker in self.workers.values():
            crashed = worker.crashed_at
            uptime = self.makespan if crashed is None else min(crashed, self.makespan)
            workers.append(
                WorkerOutcome(
                    name=worker.config.name,
                    weight=worker.config.weight,
                    uptime=uptime,
                    served=worker.served,
                    completed=worker.completed,
                    timeline=tuple(worker.timeline),
                )
            )
        return Run(
            policy=policy,
            workers=tuple(workers),
            waits=tuple(t.waited for t in self.tasks if t.started),
            makespan=self.makespan,
            starved=sum(1 for t in self.tasks if not t.dispatched),
            unfinished=sum(1 for t in self.tasks if t.dispatched and t.status != _DONE),
            reclaims=self.reclaims,
            max_cost=max((t.sim.cost for t in self.tasks), default=math.nan),
        )


def simulate(scenario: Scenario, workload: list[SimTask], policy: Policy, *, name: str) -> Run:
    """Run ``workload`` on ``scenario``'s fleet under ``policy`` (named ``name`` in results)."""
    simulation = _Simulation(scenario, workload, policy)
    simulation.run()
    return simulation.outcome(name)
