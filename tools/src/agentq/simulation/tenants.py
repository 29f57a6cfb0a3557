"""The tenants scenario: teams flood their AgentQueues, one pool of workers serves them all.

The same simulated fleet as :mod:`agentq.simulation.engine`, dispatching one of two ways:

- ``queues``: the operator's two levels (``docs/tenancy.md``). The pure queue-level
  core (:class:`agentq.scheduler.tenancy.QueueTree`, hierarchical DRR by cost) picks
  the leaf served next; its oldest task goes to the worker-level core
  (:class:`agentq.scheduler.Scheduler`); a grant charges the leaf (and its
  ancestors) its cost. A leaf whose head no worker can take now is passed over
  for the rest of the pass -- as ``operator/dispatch.py`` does.
- ``no-queues``: what agentq does without AgentQueues -- one queue of every team's
  tasks, oldest first, into the same worker-level core.

Each team sends all its tasks at once (a flood): at the start, or when the fleet
has completed a given number of tasks. What is measured is the **window while
every leaf queue is backlogged** (has tasks not yet granted): from the moment
the last flood arrives to the grant that empties the first leaf. In it, per
queue, the share of the cost granted at its level (its subtree's, over its and
its siblings') against its weight share, the difference in units of the largest
task cost (the DRR bound is one such cost per level), and the share of the
completions. A policy under which some leaf is never backlogged together with
the others has no window.
"""

from __future__ import annotations

import bisect
import json
import math
import random
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from agentq.scheduler import Scheduler, TaskSpec
from agentq.scheduler.tenancy import QueueSpec, QueueTree
from agentq.simulation.engine import _PENDING, Run, _Simulation, _Task
from agentq.simulation.metrics import percentile
from agentq.simulation.scenario import QueueConfig, Scenario
from agentq.simulation.workload import SimTask, draw_cost

__all__ = [
    "TENANT_POLICIES",
    "QueueFigures",
    "TenantRun",
    "as_json",
    "as_markdown",
    "compare_tenants",
    "generate_floods",
    "plot",
    "print_tables",
]

#: The ways of dispatching a tenants scenario compares, by the name in its tables.
TENANT_POLICIES = ("queues", "no-queues")


@dataclass(frozen=True)
class QueueFigures:
    """One queue's figures over the window (inner queues: their subtree's)."""

    name: str
    path: str  # "org-a/team-a1": the queue and its ancestors, top first
    weight_share: float  # its weight over its siblings' (its own included)
    share: float | None  # its part of the cost granted at its level in the window
    error: float | None  # (granted - weight share * level's granted) / max task cost
    completions: float | None  # its part of the completions at its level in the window
    p50_wait: float | None  # its tasks' median wait over the whole run (s)


@dataclass(frozen=True)
class TenantRun:
    """The outcome of one policy on a tenants scenario."""

    policy: str
    run: Run
    window: tuple[float, float] | None  # (start, end) while every leaf was backlogged
    queues: tuple[QueueFigures, ...]  # tree order: each parent before its children
    timelines: dict[str, tuple[tuple[float, float], ...]]  # leaf -> (time, cumulative cost)

    @property
    def max_share_error(self) -> float | None:
        errors = [abs(q.error) for q in self.queues if q.error is not None]
        return max(errors, default=None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "window": None if self.window is None else list(self.window),
            "max_share_error": self.max_share_error,
            "makespan": self.run.makespan,
            "starved": self.run.starved,
            "queues": {
                q.name: {
                    "path": q.path,
                    "weight_share": q.weight_share,
                    "share": q.share,
                    "error": q.error,
                    "completions": q.completions,
                    "p50_wait": q.p50_wait,
                }
                for q in self.queues
            },
        }


# -- the workload -----------------------------------------------------------------------


def generate_floods(scenario: Scenario) -> tuple[list[SimTask], list[str], list[int]]:
    """The teams' tasks: (tasks, the leaf queue of each, the completions after which each
    arrives). Floods that arrive together are interleaved, one task of each in turn, so
    that one queue of every task (``no-queues``) does not favour the team listed first."""
    rng = random.Random(scenario.seed)
    groups: dict[int, list[list[tuple[str, float]]]] = {}
    for team in scenario.teams:
        costs = [(team.queue, draw_cost(scenario.cost, rng)) for _ in range(team.tasks)]
        groups.setdefault(team.after_completions, []).append(costs)
    tasks: list[SimTask] = []
    leaves: list[str] = []
    after: list[int] = []
    width = len(str(sum(t.tasks for t in scenario.teams)))
    for threshold in sorted(groups):
        for batch in zip_longest(*groups[threshold]):
            for item in batch:
                if item is None:
                    continue
                queue, cost = item
                tasks.append(SimTask(f"{queue}-{len(tasks):0{width}d}", 0.0, cost, frozenset()))
                leaves.append(queue)
                after.append(threshold)
    return tasks, leaves, after


# -- the simulation -----------------------------------------------------------------------


class _TenantSimulation(_Simulation):
    def __init__(
        self,
        scenario: Scenario,
        workload: list[SimTask],
        leaves: list[str],
        after: list[int],
        *,
        queues: bool,
    ) -> None:
        self.scheduler = Scheduler()
        super().__init__(scenario, workload, self.scheduler)
        self.use_queues = queues
        self.leaf_of = leaves
        self.waiting = dict(enumerate(after))  # task -> completions it arrives after
        self.done = 0
        self.tree = QueueTree()
        specs = {q.name: q for q in scenario.queues}
        for queue in _tree_order(scenario.queues):
            self.tree.upsert_queue(QueueSpec(queue.name, parent=queue.parent, weight=queue.weight))
        self.leaves = sorted({team.queue for team in scenario.teams})
        self.lanes: dict[str, list[int]] = {leaf: [] for leaf in self.leaves}
        self.fifo: list[int] = []
        self.backlog = dict.fromkeys(self.leaves, 0)  # tasks queued, not yet granted
        self.specs = specs
        self.paths = {leaf: _path(specs, leaf) for leaf in self.leaves}
        self.window_start: float | None = None
        self.window_end: float | None = None
        self.granted_cost: dict[str, float] = dict.fromkeys(specs, 0.0)  # in the window
        self.completions: dict[str, int] = dict.fromkeys(self.leaves, 0)  # in the window
        self.served: dict[str, list[tuple[float, float]]] = {leaf: [] for leaf in self.leaves}

    # -- arrivals --------------------------------------------------------------------------

    def schedule_arrivals(self) -> None:
        self.release_floods()

    def release_floods(self) -> None:
        """Every flood whose number of completions is reached arrives now."""
        due = [i for i, after in self.waiting.items() if after <= self.done]
        for index in due:
            del self.waiting[index]
            self.arrive_at(index, self.now)

    def completed(self, task: _Task) -> None:
        self.done += 1
        leaf = self.leaf_of[task.index]
        history = self.served[leaf]
        history.append((self.now, (history[-1][1] if history else 0.0) + task.sim.cost))
        if self.window_start is not None and (
            self.window_end is None or self.now <= self.window_end
        ):
            self.completions[leaf] += 1
        if self.waiting:
            self.release_floods()

    # -- the queues ------------------------------------------------------------------------

    @property
    def open(self) -> bool:
        """Whether the window is open: every leaf has been backlogged since it opened."""
        return self.window_start is not None and self.window_end is None

    def enqueue(self, task: _Task) -> None:
        task.status = _PENDING
        if task.executing:  # a reclaimed attempt that had started: waiting again from now
            task.executing = False
            task.waiting_since = self.now
        leaf = self.leaf_of[task.index]
        bisect.insort(self.lanes[leaf], task.index)
        bisect.insort(self.fifo, task.index)
        self.backlog[leaf] += 1
        self.tree.set_pending(leaf, len(self.lanes[leaf]))
        if self.window_start is None and all(self.backlog.values()):
            self.window_start = self.now

    def granted(self, task: _Task) -> None:
        leaf = self.leaf_of[task.index]
        self.lanes[leaf].remove(task.index)
        self.fifo.remove(task.index)
        if self.open:
            for name in self.paths[leaf]:
                self.granted_cost[name] += task.sim.cost
        self.backlog[leaf] -= 1
        self.tree.set_pending(leaf, len(self.lanes[leaf]))
        if self.open and self.backlog[leaf] == 0:
            self.window_end = self.now

    def dispatch(self) -> None:
        if self.use_queues:
            self.dispatch_queues()
        else:
            self.dispatch_fifo()

    def place(self, index: int) -> str | None:
        """The worker the worker-level core gives task ``index`` (None: no worker can
        take it now)."""
        sim = self.tasks[index].sim
        planned = self.scheduler.plan([TaskSpec(sim.name, sim.required, sim.cost)])
        return planned[0].worker if planned else None

    def dispatch_fifo(self) -> None:
        """One queue of every team's tasks, oldest first (agentq without AgentQueues)."""
        while self.fifo and any(w.free for w in self.workers.values()):
            head = self.fifo[0]
            worker = self.place(head)
            if worker is None:
                return
            self.grant(self.tasks[head], self.workers[worker])

    def dispatch_queues(self) -> None:
        """The queue level's turns, as ``operator/dispatch.py`` takes them."""
        exclude: set[str] = set()
        while any(w.free for w in self.workers.values()):
            leaf = self.tree.pick(frozenset(exclude))
            if leaf is None:
                return
            head = self.lanes[leaf][0]
            worker = self.place(head)
            if worker is None:
                exclude.add(leaf)  # passed over for the rest of the pass
                continue
            self.tree.charge(leaf, self.tasks[head].sim.cost)  # then its count, as there
            self.grant(self.tasks[head], self.workers[worker])

    # -- the figures -----------------------------------------------------------------------

    def figures(self, policy: str) -> TenantRun:
        run = self.outcome(policy)
        window = None
        if self.window_start is not None:
            end = self.window_end if self.window_end is not None else run.makespan
            window = (self.window_start, end)
        # A queue no team sends to is idle: its share is lent to its siblings, and it is
        # left out (of the rows, and of its siblings' weight shares).
        active = {name for leaf in self.leaves for name in self.paths[leaf]}
        siblings: dict[str | None, list[QueueConfig]] = {}
        for queue in self.scenario.queues:
            if queue.name in active:
                siblings.setdefault(queue.parent, []).append(queue)

        def done(name: str) -> int:  # completions of its subtree in the window
            return sum(self.completions[leaf] for leaf in self.leaves if name in self.paths[leaf])

        rows = []
        for queue in _tree_order([q for q in self.scenario.queues if q.name in active]):
            level = siblings[queue.parent]
            weight_share = queue.weight / math.fsum(q.weight for q in level)
            level_cost = math.fsum(self.granted_cost[q.name] for q in level)
            share = error = None
            if window is not None and level_cost > 0:
                mine = self.granted_cost[queue.name]
                share = mine / level_cost
                error = (mine - weight_share * level_cost) / run.max_cost
            completions = None
            level_done = sum(done(q.name) for q in level)
            if window is not None and level_done:
                completions = done(queue.name) / level_done
            waits = [
                t.waited
                for t in self.tasks
                if t.started and queue.name in self.paths[self.leaf_of[t.index]]
            ]
            rows.append(
                QueueFigures(
                    name=queue.name,
                    path="/".join(reversed(_path(self.specs, queue.name))),
                    weight_share=weight_share,
                    share=share,
                    error=error,
                    completions=completions,
                    p50_wait=percentile(waits, 50),
                )
            )
        return TenantRun(
            policy=policy,
            run=run,
            window=window,
            queues=tuple(rows),
            timelines={leaf: tuple(points) for leaf, points in self.served.items()},
        )


def _path(specs: dict[str, QueueConfig], name: str) -> list[str]:
    """``name`` and its ancestors, leaf first."""
    path = [name]
    parent = specs[name].parent
    while parent is not None:
        path.append(parent)
        parent = specs[parent].parent
    return path


def _tree_order(queues: Sequence[QueueConfig]) -> list[QueueConfig]:
    """The queues depth first, each parent before its children, siblings as listed."""
    out: list[QueueConfig] = []

    def visit(parent: str | None) -> None:
        for queue in queues:
            if queue.parent == parent:
                out.append(queue)
                visit(queue.name)

    visit(None)
    return out


def compare_tenants(
    scenario: Scenario, policies: Sequence[str] = TENANT_POLICIES
) -> list[TenantRun]:
    """Run the scenario's floods under each named policy (the same tasks for all)."""
    workload, leaves, after = generate_floods(scenario)
    results = []
    for name in policies:
        simulation = _TenantSimulation(scenario, workload, leaves, after, queues=name == "queues")
        simulation.run()
        results.append(simulation.figures(name))
    return results


# -- the report -------------------------------------------------------------------------

_HEADERS = ("policy", "window (s)", "max share error (x max cost)", "makespan (s)", "starved")


def _number(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _row(result: TenantRun) -> list[str]:
    window = "-" if result.window is None else f"{result.window[0]:.1f}-{result.window[1]:.1f}"
    return [
        result.policy,
        window,
        _number(result.max_share_error, 3),
        _number(result.run.makespan, 1),
        str(result.run.starved),
    ]


def _queue_rows(results: Sequence[TenantRun]) -> tuple[list[str], list[list[str]]]:
    headers = ["queue", "weight share", "policy", "cost share", "completions", "p50 wait (s)"]
    rows = []
    for index, first in enumerate(results[0].queues if results else ()):
        for number, result in enumerate(results):
            figures = result.queues[index]
            lead = [first.path, _percent(first.weight_share)] if number == 0 else ["", ""]
            rows.append(
                [
                    *lead,
                    result.policy,
                    _percent(figures.share),
                    _percent(figures.completions),
                    _number(figures.p50_wait, 1),
                ]
            )
    return headers, rows


_CAPTION = (
    "in the window (every leaf queue has tasks not yet granted), the queue's part of the "
    "cost granted and of the tasks completed at its level (its siblings' and its own); "
    "p50 wait: over the whole run"
)


def print_tables(results: Sequence[TenantRun], *, title: str, console: Console) -> None:
    """The comparison table, then each queue's shares in the window."""
    table = Table(title=title, caption="C = the largest task cost")
    for header in ("policy", "window (s)", "share err (xC)", "makespan", "starved"):
        table.add_column(header, justify="left" if header == "policy" else "right", no_wrap=True)
    for result in results:
        table.add_row(*_row(result))
    console.print(table)
    _, rows = _queue_rows(results)
    shares = Table(title="per queue, while every queue is backlogged", caption=_CAPTION)
    for header in ("queue", "weight", "policy", "cost share", "done", "p50 wait"):
        left = header in ("queue", "policy")
        shares.add_column(header, justify="left" if left else "right", no_wrap=left)
    for row in rows:
        shares.add_row(*row)
    console.print(shares)


def as_json(results: Sequence[TenantRun]) -> str:
    """One object per policy; keys ``policy``, ``window``, ``max_share_error``,
    ``makespan``, ``starved``, ``queues`` (per queue: ``path``, ``weight_share``,
    ``share``, ``error``, ``completions``, ``p50_wait``)."""
    return json.dumps([r.as_dict() for r in results], indent=2)


def as_markdown(results: Sequence[TenantRun]) -> str:
    """The same two tables in Markdown."""

    def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
        lines = ["| " + " | ".join(headers) + " |"]
        text = ("policy", "queue")
        lines.append("|" + "|".join(":--" if h in text else "--:" for h in headers) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return lines

    headers, rows = _queue_rows(results)
    return "\n".join([*table(_HEADERS, [_row(r) for r in results]), "", *table(headers, rows)])


def plot(results: Sequence[TenantRun], path: Path, *, title: str) -> None:
    """Cumulative completed cost per leaf queue over time, one panel per policy, the
    window shaded (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never open a window
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(
        1, len(results), figsize=(5 * len(results), 4), sharey=True, squeeze=False
    )
    for axis, result in zip(axes[0], results, strict=True):
        for leaf, points in result.timelines.items():
            times = [0.0, *(t for t, _ in points)]
            served = [0.0, *(s for _, s in points)]
            axis.step(times, served, where="post", label=leaf)
        if result.window is not None:
            axis.axvspan(*result.window, color="grey", alpha=0.15, label="every queue backlogged")
        axis.set_title(result.policy)
        axis.set_xlabel("time (s)")
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("cumulative completed cost")
    axes[0][0].legend(loc="upper left", fontsize="small")
    figure.suptitle(textwrap.fill(title, 100), fontsize="medium")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
