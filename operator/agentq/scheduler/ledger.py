"""The state of the dispatch rule and every transition of it, shared by both indexes.

A :class:`Ledger` owns the bookkeeping that ``docs/scheduling.md`` defines: the
virtual time (rounds), each worker's credit tag and in-flight load, the cap on
banked credit, and what joins, leaves, pauses, assignments, aborts, releases and
restores do to them. It does not decide *which* worker is best for a task: that
is ``_select``, implemented twice -- by a full scan in
:mod:`agentq.scheduler.reference` (the rule as written) and by capability-group
heaps in :mod:`agentq.scheduler.fast` (the one the operator uses). Because both
run on this same ledger with the same float arithmetic, a test can demand that
they make exactly the same decisions.

The state, in the notation of the docs:

- ``V`` (``_vtime``): rounds elapsed. Each assignment of cost ``c`` advances it
  by ``c / W``, ``W`` the total weight of active workers, so in one round every
  active worker earns credit equal to its weight.
- per worker ``i``: a tag ``v_i`` (normalized service: credit is
  ``w_i * (V - v_i)``), its in-flight load ``L_i`` (the exact sum of the costs
  of the tasks it holds), its served cost, and while inactive its frozen credit.
- ``K`` (``cap_rounds``): the cap on banked credit, in rounds, the same for
  every worker (so a worker of weight ``w`` banks at most ``w * K``).

No clock and no randomness: the same calls give the same decisions.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from agentq.scheduler.model import Assignment, TaskSpec, WorkerSpec, WorkerState

__all__ = ["DEFAULT_CAP_TASKS", "Ledger", "UnknownWorkerError"]

#: With ``credit_cap=None`` an idle worker of average weight may bank credit worth
#: this many of the largest task seen so far. Twice the largest task is above the
#: credit any worker reaches in a busy pool of identical capabilities (there it
#: stays below one largest task per average weight), so the default cap never
#: distorts a fair pool; it only limits the catch-up burst of a worker that sat
#: idle while others worked.
DEFAULT_CAP_TASKS = 2.0


class UnknownWorkerError(KeyError):
    """A worker name the core has never been told about (or that has left)."""


class _Worker:
    """The ledger's record of one worker (mutable; never leaves the package)."""

    __slots__ = ("capped", "frozen", "load", "served", "spec", "tag", "tasks", "version")

    def __init__(self, spec: WorkerSpec, tag: float) -> None:
        self.spec = spec
        self.tag = tag  # v_i: credit is weight * (V - tag) while active
        self.load = 0.0  # L_i: exact sum of the held tasks' costs
        self.tasks: dict[str, float] = {}  # held task -> cost
        self.served = 0.0  # cost of the tasks it completed
        self.frozen: float | None = None  # credit kept while inactive (paused / not ready)
        self.version = 0  # bumped by the fast index on every change (stale heap entries)
        self.capped = False  # fast index: kept in its group's "capped" heap

    @property
    def available(self) -> bool:
        """Active and below ``max_in_flight``: may be given a task now."""
        return self.spec.active and len(self.tasks) < self.spec.max_in_flight


@dataclass(slots=True)
class _Hold:
    """A task the core believes is in flight, and how to undo the decision that placed it."""

    worker: str
    cost: float
    charged: bool  # False for assignments recorded by restore(): nothing to refund
    rounds: float  # how far the decision advanced V


class Ledger(ABC):
    """The dispatch core's state and transitions; subclasses supply the selection."""

    def __init__(self, *, credit_cap: float | None = None) -> None:
        """``credit_cap``: the most credit, in cost units, a worker of weight 1 may bank
        (a worker of weight ``w`` may bank ``w * credit_cap``).

        ``None`` (the default) adapts it to the workload: ``DEFAULT_CAP_TASKS`` (2)
        times the largest task cost seen so far, divided by the mean weight of the
        active workers -- an average worker banks at most two of the largest tasks.
        """
        if credit_cap is not None and not (math.isfinite(credit_cap) and credit_cap > 0):
            raise ValueError(f"credit_cap must be a finite number > 0, got {credit_cap!r}")
        self._credit_cap = credit_cap
        self._workers: dict[str, _Worker] = {}
        self._holds: dict[str, _Hold] = {}
        self._vtime = 0.0
        # Kept exact (floats are dyadic rationals) so that joins and leaves in any
        # order give the same W, never drifting from the sum of the active weights.
        self._active_weight = Fraction(0)
        self._active_weight_f = 0.0
        self._active_count = 0
        self._max_cost = 0.0

    # -- the rule's parameters ---------------------------------------------------------

    @property
    def virtual_time(self) -> float:
        """``V``: rounds elapsed (credit earned so far by an always-active worker of weight 1)."""
        return self._vtime

    @property
    def cap_rounds(self) -> float:
        """``K``: the current cap on banked credit per unit of weight (cost units)."""
        if self._credit_cap is not None:
            return self._credit_cap
        if self._active_count == 0:
            return DEFAULT_CAP_TASKS * self._max_cost
        return DEFAULT_CAP_TASKS * self._max_cost * self._active_count / self._active_weight_f

    def _threshold(self) -> float:
        """``V - K``: a tag below this holds more credit than the cap allows."""
        return self._vtime - self.cap_rounds

    # -- the selection, implemented by the two indexes ---------------------------------

    @abstractmethod
    def _select(
        self, required: frozenset[str], threshold: float, avoid: frozenset[str]
    ) -> tuple[_Worker | None, float]:
        """Among the available workers covering ``required`` (the eligible ones): the one
        with the least ``(max(tag, threshold) + load / weight, name)`` whose name is not
        in ``avoid`` -- or, when every eligible worker is in ``avoid``, the least of them
        (``None`` if no worker is eligible); and the least ``max(tag, threshold)`` over
        every eligible worker, avoided or not (``inf`` if there is none)."""

    @abstractmethod
    def _on_added(self, worker: _Worker) -> None:
        """``worker`` joined, or moved to another capability set (hook for indexes)."""

    @abstractmethod
    def _on_removed(self, worker: _Worker) -> None:
        """``worker`` left, or is about to move to another capability set."""

    @abstractmethod
    def _on_changed(self, worker: _Worker) -> None:
        """``worker``'s tag, load, weight or availability changed."""

    # -- membership --------------------------------------------------------------------

    def _join_active(self, weight: float) -> None:
        self._active_weight += Fraction(weight)
        self._active_weight_f = float(self._active_weight)
        self._active_count += 1

    def _leave_active(self, weight: float) -> None:
        self._active_weight -= Fraction(weight)
        self._active_weight_f = float(self._active_weight)
        self._active_count -= 1

    def _raw_credit(self, worker: _Worker) -> float:
        if worker.frozen is not None:
            return worker.frozen
        return worker.spec.weight * (self._vtime - worker.tag)

    def upsert_worker(self, spec: WorkerSpec) -> None:
        """Add a worker (with zero credit) or apply a changed spec to a known one.

        A weight change keeps the worker's credit; pausing or losing readiness
        freezes it (an inactive worker earns nothing); resuming thaws it.
        Upserting an unchanged spec does nothing.
        """
        worker = self._workers.get(spec.name)
        if worker is None:
            worker = _Worker(spec, tag=self._vtime)
            if spec.active:
                self._join_active(spec.weight)
            else:
                worker.frozen = 0.0
            self._workers[spec.name] = worker
            self._on_added(worker)
            self._on_changed(worker)
            return
        old = worker.spec
        if old == spec:
            return
        credit = self._raw_credit(worker)
        if old.active:
            self._leave_active(old.weight)
        if spec.active:
            self._join_active(spec.weight)
            if not old.active or old.weight != spec.weight:
                worker.tag = self._vtime - credit / spec.weight
            worker.frozen = None
        else:
            worker.frozen = credit
        moved = old.capabilities != spec.capabilities
        if moved:
            self._on_removed(worker)
        worker.spec = spec
        if moved:
            self._on_added(worker)
        self._on_changed(worker)

    def remove_worker(self, name: str) -> list[str]:
        """Forget a worker; returns (sorted) the tasks it held, whose load is released.

        The caller re-queues those tasks; their cost is not counted as served.
        """
        worker = self._workers.pop(name, None)
        if worker is None:
            raise UnknownWorkerError(name)
        if worker.spec.active:
            self._leave_active(worker.spec.weight)
        held = sorted(worker.tasks)
        for task in held:
            del self._holds[task]
        self._on_removed(worker)
        return held

    # -- decisions ---------------------------------------------------------------------

    def plan(self, tasks: Sequence[TaskSpec]) -> list[Assignment]:
        """Decide a batch in the given (queue) order; returns one assignment per placed task.

        A task no available worker covers is skipped (it stays pending). Each
        decision is applied at once (credit spent, load added, ``V`` advanced),
        so later tasks of the batch see it; undo a decision whose commit failed
        with :meth:`abort`. A task the core still believes in flight is pending
        again by the caller's word: its old hold is released as a reclaim first.
        """
        counts = Counter(task.name for task in tasks)
        if len(counts) != len(tasks):
            dupes = sorted(name for name, count in counts.items() if count > 1)
            raise ValueError(f"tasks listed twice in one batch: {', '.join(dupes)}")
        decisions: list[Assignment] = []
        for task in tasks:
            if task.name in self._holds:
                self.release(task.name, completed=False)
            if task.cost > self._max_cost:
                self._max_cost = task.cost
            threshold = self._threshold()
            worker, floor = self._select(task.required, threshold, task.avoid)
            if worker is not None:
                decisions.append(self._charge(worker, task, threshold, floor))
        return decisions

    def _charge(
        self, worker: _Worker, task: TaskSpec, threshold: float, floor: float
    ) -> Assignment:
        start = self._vtime
        if floor > start:
            # No eligible worker is owed anything: start the next round(s), as DRR
            # does when every active queue has spent its deficit. Every tag of an
            # eligible worker is >= floor > V - K, so none of them was capped and
            # the choice made above stands.
            self._vtime = floor
            threshold = self._threshold()
        # Credit above the cap is forfeited first, then the task's cost is spent.
        worker.tag = max(worker.tag, threshold) + task.cost / worker.spec.weight
        worker.tasks[task.name] = task.cost
        worker.load = math.fsum(worker.tasks.values())
        self._vtime += task.cost / self._active_weight_f
        rounds = self._vtime - start
        self._holds[task.name] = _Hold(worker.spec.name, task.cost, charged=True, rounds=rounds)
        self._on_changed(worker)
        return Assignment(task=task.name, worker=worker.spec.name, cost=task.cost)

    def abort(self, assignment: Assignment) -> None:
        """The caller could not commit ``assignment``: undo it.

        The worker gets its credit back and sheds the load, and ``V`` steps back
        by the round the decision advanced, so no one keeps credit earned from a
        dispatch that never happened. Credit the worker forfeited to the cap when
        it was charged stays forfeited. Aborting a decision the core no longer
        holds (released, or its worker removed) does nothing.
        """
        hold = self._holds.get(assignment.task)
        if hold is None:
            return
        if hold.worker != assignment.worker:
            raise ValueError(
                f"task {assignment.task!r} is held by {hold.worker!r}, not {assignment.worker!r}"
            )
        del self._holds[assignment.task]
        worker = self._workers[hold.worker]
        if hold.charged:
            if worker.frozen is not None:
                worker.frozen += hold.cost
            else:
                worker.tag -= hold.cost / worker.spec.weight
            self._vtime -= hold.rounds
        self._unhold(worker, assignment.task)

    def release(self, task: str, *, completed: bool) -> None:
        """``task`` finished (``completed=True``: its cost counts as served) or was
        reclaimed (``False``): release its load. Credit is not refunded either way --
        a worker whose task expired spent its turn. Unknown tasks are ignored.
        """
        hold = self._holds.pop(task, None)
        if hold is None:
            return
        worker = self._workers[hold.worker]
        if completed:
            worker.served += hold.cost
        self._unhold(worker, task)

    def _unhold(self, worker: _Worker, task: str) -> None:
        del worker.tasks[task]
        worker.load = math.fsum(worker.tasks.values())
        self._on_changed(worker)

    def restore(self, assignment: Assignment) -> None:
        """Record an assignment that already exists (read back after a restart).

        It adds load but charges no credit and does not advance ``V``: that
        decision was paid for before. Restoring what is already recorded does
        nothing; restoring a task held by another worker moves it.
        """
        worker = self._workers.get(assignment.worker)
        if worker is None:
            raise UnknownWorkerError(assignment.worker)
        hold = self._holds.get(assignment.task)
        if hold is not None:
            if hold.worker == assignment.worker:
                return
            self.release(assignment.task, completed=False)
        if assignment.cost > self._max_cost:
            self._max_cost = assignment.cost
        worker.tasks[assignment.task] = assignment.cost
        worker.load = math.fsum(worker.tasks.values())
        self._holds[assignment.task] = _Hold(
            assignment.worker, assignment.cost, charged=False, rounds=0.0
        )
        self._on_changed(worker)

    # -- reading -----------------------------------------------------------------------

    def worker_state(self, name: str) -> WorkerState:
        """A snapshot of one worker's bookkeeping; ``deficit`` is its usable (capped) credit."""
        worker = self._workers.get(name)
        if worker is None:
            raise UnknownWorkerError(name)
        return WorkerState(
            deficit=min(self._raw_credit(worker), worker.spec.weight * self.cap_rounds),
            in_flight=len(worker.tasks),
            in_flight_cost=worker.load,
            served_cost=worker.served,
            tasks=frozenset(worker.tasks),
        )

    def carry_over_served(self, name: str, served_cost: float) -> None:
        """Continue a worker's cumulative served cost from an earlier core's count.

        A new operator leader (or a restarted one) builds a fresh core; the worker's
        status still says what it served so far. Decisions never read served cost, so
        this changes what is reported and nothing else.
        """
        worker = self._workers.get(name)
        if worker is None:
            raise UnknownWorkerError(name)
        if not (math.isfinite(served_cost) and served_cost >= 0):
            raise ValueError(f"served cost must be a finite number >= 0, got {served_cost!r}")
        worker.served = max(worker.served, served_cost)

    def has_worker(self, name: str) -> bool:
        """Whether the core knows ``name`` (O(1), unlike :meth:`workers`)."""
        return name in self._workers

    def workers(self) -> list[str]:
        """The names of the known workers, sorted."""
        return sorted(self._workers)

    def holder(self, task: str) -> str | None:
        """The worker the core believes holds ``task``, if any."""
        hold = self._holds.get(task)
        return None if hold is None else hold.worker

    def holds(self) -> dict[str, str]:
        """Every task the core believes in flight, and its worker (a copy)."""
        return {task: hold.worker for task, hold in self._holds.items()}

    def worker_spec(self, name: str) -> WorkerSpec:
        """The spec the core holds for ``name``."""
        worker = self._workers.get(name)
        if worker is None:
            raise UnknownWorkerError(name)
        return worker.spec
