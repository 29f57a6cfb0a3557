"""What a simulation runs: a fleet, a workload, and the presets ``agentq simulate`` offers.

A :class:`Scenario` is plain data, read from YAML (or built from flags) and
checked here, so the engine never sees a bad value. Times are in seconds of
simulated time; costs in the same relative units as ``AgentTask.spec.cost``; a
worker's ``speed`` is how many cost units per second it works off, in the way
the scenario's ``execution`` says (see :mod:`agentq.simulation.engine`):
``shared`` (the default) all it holds at once sharing the speed, ``serial``
one task at a time, ``slots`` all it holds at once each at full speed.

A scenario with ``teams`` is a *tenants* scenario (:mod:`agentq.simulation.tenants`):
instead of one Poisson stream, each team floods its AgentQueue (a leaf of the
``queues`` tree) with its tasks at once, at the start or after the fleet's first
completions, and the fleet is the one pool every queue shares.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "PRESETS",
    "CapabilityDemand",
    "CostModel",
    "QueueConfig",
    "Scenario",
    "ScenarioError",
    "TeamConfig",
    "WorkerConfig",
    "preset",
    "scenario_from_mapping",
]

DISTRIBUTIONS = ("fixed", "uniform", "exponential", "pareto")
EXECUTIONS = ("serial", "shared", "slots")


class ScenarioError(ValueError):
    """A scenario that cannot be simulated; the message says which field and why."""


@dataclass(frozen=True)
class WorkerConfig:
    """One simulated worker. ``speed`` defaults to ``weight`` (weight = capacity)."""

    name: str
    weight: float = 1.0
    speed: float | None = None
    max_in_flight: int = 4
    capabilities: frozenset[str] = frozenset()
    crash_at: float | None = None  # the worker dies silently at this time

    @property
    def rate(self) -> float:
        """Its speed: cost units per second (see the module docstring)."""
        return self.weight if self.speed is None else self.speed


@dataclass(frozen=True)
class CostModel:
    """The distribution of task costs.

    ``fixed``: always ``scale``; ``uniform``: between ``low`` and ``high``;
    ``exponential``: mean ``scale``; ``pareto``: minimum ``scale``, shape
    ``alpha`` (heavy-tailed: alpha 1.5 has a finite mean, ``scale * alpha /
    (alpha - 1)``, and an infinite variance).
    """

    distribution: str = "pareto"
    scale: float = 1.0
    alpha: float = 1.5
    low: float = 0.5
    high: float = 1.5

    @property
    def mean(self) -> float:
        if self.distribution == "uniform":
            return (self.low + self.high) / 2
        if self.distribution == "pareto":
            return self.scale * self.alpha / (self.alpha - 1)
        return self.scale


@dataclass(frozen=True)
class CapabilityDemand:
    """A share of the tasks that require ``required``."""

    required: frozenset[str]
    share: float


@dataclass(frozen=True)
class QueueConfig:
    """One AgentQueue of a tenants scenario: its weight among its siblings, its parent."""

    name: str
    weight: float = 1.0
    parent: str | None = None


@dataclass(frozen=True)
class TeamConfig:
    """A team's flood: ``tasks`` tasks into leaf ``queue``, all at once, when the fleet
    has completed ``after_completions`` tasks (0: at the start)."""

    queue: str
    tasks: int
    after_completions: int = 0


#: The default mix: every task can run anywhere.
ANY_TASK = CapabilityDemand(frozenset(), 1.0)


@dataclass(frozen=True)
class Scenario:
    """A fleet and a workload. Give ``load`` (target utilization of the fleet's
    capacity) or ``arrival_rate`` (tasks per second); ``load`` wins if both are set."""

    workers: tuple[WorkerConfig, ...]
    tasks: int = 3000
    load: float | None = 0.8
    arrival_rate: float | None = None
    cost: CostModel = field(default_factory=CostModel)
    capability_mix: tuple[CapabilityDemand, ...] = (ANY_TASK,)
    lease_seconds: float = 30.0
    seed: int = 1
    execution: str = "shared"
    queues: tuple[QueueConfig, ...] = ()
    teams: tuple[TeamConfig, ...] = ()

    @property
    def tenants(self) -> bool:
        """A tenants scenario: teams flood AgentQueues (``tasks``, ``load``,
        ``arrival_rate`` and ``capability_mix`` do not apply)."""
        return bool(self.teams)

    def capacity(self, worker: WorkerConfig) -> float:
        """Cost units per second ``worker`` completes while it holds as much as it may."""
        if self.execution == "slots":
            return worker.rate * worker.max_in_flight
        return worker.rate

    @property
    def rate(self) -> float:
        """Tasks arriving per second (Poisson)."""
        if self.load is not None:
            capacity = math.fsum(self.capacity(w) for w in self.workers)
            return self.load * capacity / self.cost.mean
        assert self.arrival_rate is not None
        return self.arrival_rate

    def check(self) -> Scenario:
        """Return ``self`` if it can be simulated, else raise :class:`ScenarioError`."""
        if not self.workers:
            raise ScenarioError("workers: at least one worker is needed")
        names = [w.name for w in self.workers]
        if len(set(names)) != len(names):
            raise ScenarioError("workers: names must be unique")
        for w in self.workers:
            _positive(f"workers.{w.name}.weight", w.weight)
            _positive(f"workers.{w.name}.speed", w.rate)
            if w.max_in_flight < 1:
                raise ScenarioError(f"workers.{w.name}.max_in_flight: must be >= 1")
            if w.crash_at is not None and not (math.isfinite(w.crash_at) and w.crash_at >= 0):
                raise ScenarioError(f"workers.{w.name}.crash_at: must be a time >= 0")
        if self.execution not in EXECUTIONS:
            raise ScenarioError(f"execution: {self.execution!r} is not one of {EXECUTIONS}")
        if self.tasks < 1:
            raise ScenarioError("tasks: must be >= 1")
        if self.load is not None:
            _positive("load", self.load)
        elif self.arrival_rate is not None:
            _positive("arrival_rate", self.arrival_rate)
        else:
            raise ScenarioError("give load or arrival_rate")
        if self.cost.distribution not in DISTRIBUTIONS:
            raise ScenarioError(
                f"cost.distribution: {self.cost.distribution!r} is not one of {DISTRIBUTIONS}"
            )
        _positive("cost.scale", self.cost.scale)
        if self.cost.distribution == "pareto" and not self.cost.alpha > 1:
            raise ScenarioError("cost.alpha: must be > 1 (the mean must be finite)")
        if self.cost.distribution == "uniform" and not 0 < self.cost.low <= self.cost.high:
            raise ScenarioError("cost: need 0 < low <= high")
        if not self.capability_mix:
            raise ScenarioError("capability_mix: at least one entry is needed")
        for demand in self.capability_mix:
            _positive("capability_mix.share", demand.share)
        _positive("lease_seconds", self.lease_seconds)
        if self.teams or self.queues:
            _check_tenants(self.queues, self.teams)
        return self


def _check_tenants(queues: Sequence[QueueConfig], teams: Sequence[TeamConfig]) -> None:
    if not teams:
        raise ScenarioError("teams: queues need at least one team")
    names = [q.name for q in queues]
    if len(set(names)) != len(names):
        raise ScenarioError("queues: names must be unique")
    by_name = {q.name: q for q in queues}
    for queue in queues:
        if not queue.name or "/" in queue.name:
            raise ScenarioError(f"queues: {queue.name!r} is not a queue name")
        _positive(f"queues.{queue.name}.weight", queue.weight)
        if queue.parent is not None and queue.parent not in by_name:
            raise ScenarioError(f"queues.{queue.name}.parent: no queue named {queue.parent!r}")
        seen = {queue.name}
        parent = queue.parent
        while parent is not None:
            if parent in seen:
                raise ScenarioError(f"queues.{queue.name}.parent: the parents form a cycle")
            seen.add(parent)
            parent = by_name[parent].parent
    inner = {q.parent for q in queues if q.parent is not None}
    for team in teams:
        if team.queue not in by_name:
            raise ScenarioError(f"teams.{team.queue}: no queue named {team.queue!r}")
        if team.queue in inner:
            raise ScenarioError(f"teams.{team.queue}: only a leaf queue (no children) holds tasks")
        if isinstance(team.tasks, bool) or not isinstance(team.tasks, int) or team.tasks < 1:
            raise ScenarioError(f"teams.{team.queue}.tasks: must be an integer >= 1")
        if team.after_completions < 0:
            raise ScenarioError(f"teams.{team.queue}.after_completions: must be >= 0")
    if len({t.queue for t in teams}) != len(teams):
        raise ScenarioError("teams: one team per queue")
    for team in teams:
        # A flood waits for completions of the floods before it: there must be enough.
        earlier = sum(t.tasks for t in teams if t.after_completions < team.after_completions)
        if team.after_completions > earlier:
            raise ScenarioError(
                f"teams.{team.queue}.after_completions: only {earlier} task(s) arrive before it"
            )


def _positive(what: str, value: float) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ScenarioError(f"{what}: must be a number > 0, got {value!r}")


# -- reading YAML ---------------------------------------------------------------------------


def _fields(what: str, data: object, allowed: Sequence[str]) -> Mapping[str, Any]:
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{what}: expected a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ScenarioError(f"{what}: unknown field(s) {', '.join(map(str, unknown))}")
    return data


def _number(what: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ScenarioError(f"{what}: expected a number, got {value!r}")
    return float(value)


def _integer(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{what}: expected an integer, got {value!r}")
    return value


def _names(what: str, value: object) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ScenarioError(f"{what}: expected a list of names, got {value!r}")
    return frozenset(value)


def scenario_from_mapping(data: object) -> Scenario:
    """Build a scenario from parsed YAML (see ``docs/scheduling.md`` for the schema)."""
    top = _fields(
        "scenario",
        data,
        [
            *("seed", "tasks", "load", "arrival_rate", "cost", "capability_mix"),
            *("workers", "lease_seconds", "execution", "queues", "teams"),
        ],
    )
    queues, teams = _tenants(top)
    workers = []
    raw_workers = top.get("workers")
    if not isinstance(raw_workers, list):
        raise ScenarioError("workers: expected a list of workers")
    for index, raw in enumerate(raw_workers):
        entry = _fields(
            f"workers[{index}]",
            raw,
            ["name", "weight", "speed", "max_in_flight", "capabilities", "crash_at"],
        )
        name = entry.get("name", f"w{index + 1}")
        if not isinstance(name, str) or not name:
            raise ScenarioError(f"workers[{index}].name: expected a name")
        workers.append(
            WorkerConfig(
                name=name,
                weight=_number(f"{name}.weight", entry.get("weight", 1.0)),
                speed=None if "speed" not in entry else _number(f"{name}.speed", entry["speed"]),
                max_in_flight=_integer(f"{name}.max_in_flight", entry.get("max_in_flight", 4)),
                capabilities=_names(f"{name}.capabilities", entry.get("capabilities", [])),
                crash_at=(
                    None
                    if entry.get("crash_at") is None
                    else _number(f"{name}.crash_at", entry["crash_at"])
                ),
            )
        )
    cost = CostModel()
    if "cost" in top:
        raw_cost = _fields("cost", top["cost"], ["distribution", "scale", "alpha", "low", "high"])
        distribution = raw_cost.get("distribution", cost.distribution)
        if not isinstance(distribution, str):
            raise ScenarioError("cost.distribution: expected a name")
        cost = CostModel(
            distribution=distribution,
            **{
                key: _number(f"cost.{key}", raw_cost[key])
                for key in ("scale", "alpha", "low", "high")
                if key in raw_cost
            },
        )
    mix: tuple[CapabilityDemand, ...] = (ANY_TASK,)
    if "capability_mix" in top:
        raw_mix = top["capability_mix"]
        if not isinstance(raw_mix, list):
            raise ScenarioError("capability_mix: expected a list")
        mix = tuple(
            CapabilityDemand(
                required=_names(
                    f"capability_mix[{i}].required",
                    _fields(f"capability_mix[{i}]", m, ["required", "share"]).get("required", []),
                ),
                share=_number(f"capability_mix[{i}].share", m.get("share", 1.0)),
            )
            for i, m in enumerate(raw_mix)
        )
    load: float | None = None
    rate: float | None = None
    if "load" in top:
        load = _number("load", top["load"])
    if "arrival_rate" in top:
        rate = _number("arrival_rate", top["arrival_rate"])
    if load is None and rate is None:
        load = 0.8
    return Scenario(
        queues=queues,
        teams=teams,
        workers=tuple(workers),
        tasks=_integer("tasks", top.get("tasks", 3000)),
        load=load,
        arrival_rate=rate,
        cost=cost,
        capability_mix=mix,
        lease_seconds=_number("lease_seconds", top.get("lease_seconds", 30.0)),
        seed=_integer("seed", top.get("seed", 1)),
        execution=str(top.get("execution", "shared")),
    ).check()


def _tenants(top: Mapping[str, Any]) -> tuple[tuple[QueueConfig, ...], tuple[TeamConfig, ...]]:
    """The ``queues`` and ``teams`` of a tenants scenario (both empty otherwise)."""
    if "teams" not in top:
        if "queues" in top:
            raise ScenarioError("queues: give the teams that flood them (teams)")
        return (), ()
    clash = sorted({"tasks", "load", "arrival_rate", "capability_mix"} & set(top))
    if clash:
        raise ScenarioError(
            f"{', '.join(clash)}: does not apply to a scenario with teams (each team says "
            "how many tasks it sends, and when)"
        )
    raw_queues, raw_teams = top.get("queues"), top["teams"]
    if not isinstance(raw_queues, list) or not raw_queues:
        raise ScenarioError("queues: expected a list of queues")
    if not isinstance(raw_teams, list) or not raw_teams:
        raise ScenarioError("teams: expected a list of teams")
    queues = []
    for index, raw in enumerate(raw_queues):
        entry = _fields(f"queues[{index}]", raw, ["name", "weight", "parent"])
        name, parent = entry.get("name"), entry.get("parent")
        if not isinstance(name, str) or not name:
            raise ScenarioError(f"queues[{index}].name: expected a name")
        if parent is not None and not isinstance(parent, str):
            raise ScenarioError(f"queues.{name}.parent: expected a queue name")
        weight = _number(f"queues.{name}.weight", entry.get("weight", 1.0))
        queues.append(QueueConfig(name, weight=weight, parent=parent))
    teams = []
    for index, raw in enumerate(raw_teams):
        entry = _fields(f"teams[{index}]", raw, ["queue", "tasks", "after_completions"])
        queue = entry.get("queue")
        if not isinstance(queue, str) or not queue:
            raise ScenarioError(f"teams[{index}].queue: expected a queue name")
        teams.append(
            TeamConfig(
                queue,
                tasks=_integer(f"teams.{queue}.tasks", entry.get("tasks")),
                after_completions=_integer(
                    f"teams.{queue}.after_completions", entry.get("after_completions", 0)
                ),
            )
        )
    return tuple(queues), tuple(teams)


# -- presets --------------------------------------------------------------------------------

_WEIGHTED = (
    WorkerConfig("small", weight=1.0),
    WorkerConfig("medium", weight=2.0),
    WorkerConfig("large", weight=4.0),
)

_POOL = tuple(WorkerConfig(f"agent-{i}", weight=1.0, max_in_flight=2) for i in range(1, 5))
_TENANT_COST = CostModel(distribution="uniform", low=0.5, high=1.5)
_TEAMS = (TeamConfig("team-a", 300), TeamConfig("team-b", 100, after_completions=20))

PRESETS: dict[str, Scenario] = {
    # The target: weights 1:2:4 (capacity in proportion), Pareto(1.5) costs,
    # 80% of the fleet's capacity.
    "weighted": Scenario(workers=_WEIGHTED, tasks=10_000, load=0.8),
    # The same fleet where "large" dies silently after a minute: its tasks come back
    # when their leases expire and go elsewhere (the load fits the survivors).
    "crash": Scenario(
        workers=(_WEIGHTED[0], _WEIGHTED[1], replace(_WEIGHTED[2], crash_at=60.0)),
        tasks=3000,
        load=0.35,
    ),
    # Coarse capabilities: only some workers have a GPU, and one requirement
    # nobody satisfies (those tasks are reported as never dispatched).
    "capabilities": Scenario(
        workers=(
            WorkerConfig("cpu-1", weight=1.0, capabilities=frozenset({"py"})),
            WorkerConfig("cpu-2", weight=1.0, capabilities=frozenset({"py"})),
            WorkerConfig("gpu-1", weight=2.0, capabilities=frozenset({"py", "gpu"})),
            WorkerConfig("gpu-2", weight=4.0, capabilities=frozenset({"py", "gpu"})),
        ),
        capability_mix=(
            CapabilityDemand(frozenset({"py"}), 0.7),
            CapabilityDemand(frozenset({"gpu"}), 0.29),
            CapabilityDemand(frozenset({"tpu"}), 0.01),
        ),
        tasks=5000,
        load=0.8,
    ),
    # Tenants (issue 20): one pool of four agents (two tasks each) shared by two teams'
    # AgentQueues of equal weights; team A floods 300 tasks, team B sends 100 after the
    # pool's first 20 completions. Costs between 0.5 and 1.5, so that the share of the
    # completions tells the same story as the share of cost.
    "tenants": Scenario(
        workers=_POOL,
        cost=_TENANT_COST,
        queues=(QueueConfig("team-a"), QueueConfig("team-b")),
        teams=_TEAMS,
    ),
    # The same with weights 1:3: the team that comes second gets three quarters.
    "tenants-weighted": Scenario(
        workers=_POOL,
        cost=_TENANT_COST,
        queues=(QueueConfig("team-a", weight=1.0), QueueConfig("team-b", weight=3.0)),
        teams=_TEAMS,
    ),
    # Nested: orgs 2:1, two teams of equal weights under org-a; team-a1 floods 300
    # tasks, team-a2 and org-b 100 each after the first 20 completions.
    "tenants-nested": Scenario(
        workers=_POOL,
        cost=_TENANT_COST,
        queues=(
            QueueConfig("org-a", weight=2.0),
            QueueConfig("team-a1", parent="org-a"),
            QueueConfig("team-a2", parent="org-a"),
            QueueConfig("org-b", weight=1.0),
        ),
        teams=(
            TeamConfig("team-a1", 300),
            TeamConfig("team-a2", 100, after_completions=20),
            TeamConfig("org-b", 100, after_completions=20),
        ),
    ),
}


def preset(name: str) -> Scenario:
    """A built-in scenario by name (``weighted``, ``crash``, ``capabilities``, ``tenants``,
    ``tenants-weighted``, ``tenants-nested``)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ScenarioError(
            f"unknown scenario {name!r}; choose one of {', '.join(sorted(PRESETS))}"
        ) from None
