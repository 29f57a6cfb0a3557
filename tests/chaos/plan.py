"""The chaos run's plan, derived from a seed alone: workload and fault schedule.

Pure (no I/O, no clock): ``make_plan(seed, profile)`` always returns the same
``Plan`` for the same arguments, so a failing run is reproduced by its seed.

Faults fire at points of *progress* (a fraction of the tasks terminal), not at
wall-clock times: a slow machine shifts them in time but every fault still fires,
between the same amounts of completed work, in the same order, on the same target.

The poison set: tasks requiring the ``poison`` capability, which only workers whose
agent fails every attempt offer. Normal tasks all require ``llm``, which no poison
worker offers, so a normal task can never land on a failing agent and the run can
assert ``DeadLettered == poison set`` exactly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

# Fault kinds. Agent-side: the agent process and its sidecar (one process for the
# scripted agent, two for sidecar + agent-sim). Operator-side: the current leader of
# the two replicas, the API server, a replica's wall clock.
AGENT_KILL = "agent-kill"
AGENT_STOP = "agent-stop"
SIDECAR_KILL = "sidecar-kill"
SIDECAR_STOP = "sidecar-stop"
LEADER_KILL = "leader-kill"
LEADER_TERM = "leader-term"
LEADER_STOP = "leader-stop"
APISERVER_RESTART = "apiserver-restart"
CLOCK_STEP = "clock-step"

AGENT_FAULTS = (AGENT_KILL, AGENT_STOP, SIDECAR_KILL, SIDECAR_STOP)
OPERATOR_FAULTS = (LEADER_KILL, LEADER_TERM, LEADER_STOP, APISERVER_RESTART, CLOCK_STEP)

POISON = "poison"
# The AgentBudget of the run (its maxConcurrent in the profile): every third normal task
# names it, so the watch can check that a failover never lets a fourth claim through.
BUDGET = "chaos-provider"
BUDGET_EVERY = 3
NORMAL_REQUIREMENTS: tuple[tuple[str, ...], ...] = (
    ("llm",),
    ("llm",),
    ("llm", "code"),
    ("llm", "gpu"),
    ("code", "gpu", "llm"),
)
WORKER_CAPABILITIES: tuple[tuple[str, ...], ...] = (
    ("code", "gpu", "llm"),  # first: every requirement above is covered by someone
    ("code", "llm"),
    ("gpu", "llm"),
    ("llm",),
)


@dataclass(frozen=True)
class WorkerPlan:
    name: str
    capabilities: tuple[str, ...]
    weight: float
    max_in_flight: int
    behaviour: str  # "complete" or "fail" (poison workers)
    work_seconds: float

    @property
    def poison(self) -> bool:
        return self.behaviour == "fail"


@dataclass(frozen=True)
class TaskPlan:
    name: str
    requires: tuple[str, ...]
    cost: float
    lease_seconds: int
    max_reclaims: int
    budget: str | None = None  # an AgentBudget it names (requests 0: its claims only)

    @property
    def poison(self) -> bool:
        return POISON in self.requires


@dataclass(frozen=True)
class Fault:
    """One fault: fired once ``at`` of the tasks are terminal.

    ``target`` is a worker name for agent faults, ``leader`` for the leader's faults
    (the replica leading when the fault fires), ``kube-apiserver``, or ``stepped`` for
    the replica whose clock an earlier step moved. ``seconds`` is how long a
    process stays stopped, how long the API server stays down, or the clock offset
    set (relative to the real time; 0 puts the clock right again).
    """

    at: float
    kind: str
    target: str
    seconds: float = 0.0

    def describe(self) -> str:
        if self.kind == CLOCK_STEP:
            return f"{self.kind} {self.target} to {self.seconds:+.0f}s"
        extra = f" {self.seconds:.1f}s" if self.seconds else ""
        return f"{self.kind} {self.target}{extra}"


@dataclass(frozen=True)
class Profile:
    tasks: int
    workers: int
    poison_workers: int
    poison_tasks: int
    faults: dict[str, int]
    lease_seconds: int = 6
    normal_max_reclaims: int = 10
    poison_max_reclaims: int = 2
    # Operator replicas come back this long after a kill or a graceful stop (as a
    # Deployment's pod would); agent processes after this long (as a kubelet would).
    replica_restart_seconds: tuple[float, float] = (1.0, 3.0)
    agent_restart_seconds: tuple[float, float] = (0.5, 2.0)
    # After the +2 h clock step, a later step puts the replica's clock right again
    # (as an NTP daemon would); without it the run ends with the clock still ahead.
    clock_correction: bool = True
    # How long a (healthy) agent works on a task, per worker: drawn from this range.
    # Long enough in the full run that the run outlasts its fault schedule (the faults
    # fire one after another, each waiting for a stable leader): with 0.3-1.5 s the
    # 1,000 tasks were done in ~130 s and 15 of the 33 faults hit an idle fleet.
    work_seconds: tuple[float, float] = (0.3, 1.5)
    # maxConcurrent of the run's AgentBudget (``BUDGET``), named by every third normal task.
    budget_max_concurrent: int = 3


PROFILES: dict[str, Profile] = {
    "full": Profile(
        tasks=1000,
        workers=20,
        poison_workers=2,
        poison_tasks=30,
        faults={
            AGENT_KILL: 6,
            AGENT_STOP: 6,
            SIDECAR_KILL: 4,
            SIDECAR_STOP: 4,
            LEADER_KILL: 4,
            LEADER_TERM: 3,
            LEADER_STOP: 3,
            APISERVER_RESTART: 1,
            CLOCK_STEP: 1,  # +2 h on a replica; a second step puts it right (added below)
        },
        work_seconds=(8.0, 24.0),
    ),
    "short": Profile(
        tasks=150,
        workers=8,
        poison_workers=1,
        poison_tasks=6,
        faults={
            AGENT_KILL: 1,
            AGENT_STOP: 1,
            SIDECAR_KILL: 1,
            SIDECAR_STOP: 1,
            LEADER_KILL: 1,
            LEADER_TERM: 1,
            LEADER_STOP: 1,
            APISERVER_RESTART: 1,
            CLOCK_STEP: 1,
        },
        clock_correction=False,
    ),
}


@dataclass(frozen=True)
class Plan:
    seed: int
    profile: str
    workers: tuple[WorkerPlan, ...]
    tasks: tuple[TaskPlan, ...]
    faults: tuple[Fault, ...]
    replica_restart_seconds: tuple[float, ...] = field(default=())
    agent_restart_seconds: tuple[float, ...] = field(default=())
    budget_max_concurrent: int = 3

    @property
    def poison_set(self) -> frozenset[str]:
        return frozenset(t.name for t in self.tasks if t.poison)

    def worker(self, name: str) -> WorkerPlan:
        return next(w for w in self.workers if w.name == name)


def _workers(rng: random.Random, profile: Profile) -> list[WorkerPlan]:
    workers = []
    normal = profile.workers - profile.poison_workers
    for i in range(normal):
        caps = WORKER_CAPABILITIES[i] if i < len(WORKER_CAPABILITIES) else None
        workers.append(
            WorkerPlan(
                name=f"w{i:02d}",
                capabilities=caps or rng.choice(WORKER_CAPABILITIES),
                weight=rng.choice((0.5, 1.0, 1.0, 2.0, 3.0)),
                max_in_flight=rng.randint(1, 4),
                behaviour="complete",
                work_seconds=round(rng.uniform(*profile.work_seconds), 2),
            )
        )
    for i in range(profile.poison_workers):
        workers.append(
            WorkerPlan(
                name=f"p{i}",
                capabilities=(POISON,),
                weight=1.0,
                max_in_flight=2,
                behaviour="fail",
                work_seconds=0.2,
            )
        )
    return workers


def _tasks(rng: random.Random, profile: Profile) -> list[TaskPlan]:
    poison_at = set(rng.sample(range(profile.tasks), profile.poison_tasks))
    tasks = []
    for i in range(profile.tasks):
        poison = i in poison_at
        tasks.append(
            TaskPlan(
                name=f"t{i:04d}",
                requires=(POISON,) if poison else rng.choice(NORMAL_REQUIREMENTS),
                cost=rng.choice((1.0, 1.0, 2.0, 3.0)),
                lease_seconds=profile.lease_seconds,
                max_reclaims=profile.poison_max_reclaims if poison else profile.normal_max_reclaims,
                # (by the index, not drawn: the rest of the plan stays what the seed made)
                budget=None if poison or i % BUDGET_EVERY else BUDGET,
            )
        )
    return tasks


def _faults(rng: random.Random, profile: Profile, workers: list[WorkerPlan]) -> list[Fault]:
    kinds = [kind for kind, count in profile.faults.items() for _ in range(count)]
    rng.shuffle(kinds)
    # Progress points spread over [5 %, 85 %] of the run: one per slot, jittered within
    # it, so faults neither bunch up nor all land at the start.
    correct = CLOCK_STEP in kinds and profile.clock_correction
    slots = len(kinds) + (1 if correct else 0)
    points = [round(0.05 + 0.8 * (i + rng.uniform(0.1, 0.9)) / slots, 4) for i in range(slots)]
    targets = [w.name for w in workers]
    faults: list[Fault] = []
    for kind, at in zip(kinds, points, strict=False):
        if kind in AGENT_FAULTS:
            stopped = kind in (AGENT_STOP, SIDECAR_STOP)
            # Stops both shorter and longer than the lease (6 s): a short one must cost
            # nothing, a long one its claims.
            seconds = round(rng.choice((2.0, 3.0, 9.0, 12.0)), 1) if stopped else 0.0
            faults.append(Fault(at, kind, rng.choice(targets), seconds))
        elif kind == LEADER_STOP:
            # Longer than the election lease (4 s), so the standby takes over meanwhile,
            # and often longer than the claims' lease (6 s): the stalled leader wakes up
            # to a store that looks as if no holder renewed for that long.
            faults.append(Fault(at, kind, "leader", round(rng.uniform(5.0, 12.0), 1)))
        elif kind == APISERVER_RESTART:
            faults.append(Fault(at, kind, "kube-apiserver", round(rng.uniform(3.0, 6.0), 1)))
        elif kind == CLOCK_STEP:
            faults.append(Fault(at, kind, "leader", 7200.0))
        else:
            faults.append(Fault(at, kind, "leader"))
    step = next((f for f in faults if f.kind == CLOCK_STEP), None)
    if step is not None and correct:
        later = [p for p in points[len(kinds) :] if p > step.at] or [0.9]
        faults.append(Fault(max(later), CLOCK_STEP, "stepped", 0.0))
    return sorted(faults, key=lambda f: f.at)


def make_plan(seed: int, profile: str = "full", *, tasks: int | None = None) -> Plan:
    """The plan for ``seed``: the same arguments always give the same plan."""
    base = PROFILES[profile]
    if tasks is not None:
        scale = tasks / base.tasks
        base = Profile(
            **{
                **base.__dict__,
                "tasks": tasks,
                "poison_tasks": max(1, round(base.poison_tasks * scale)),
            }
        )
    rng = random.Random(f"agentq-chaos-{seed}")
    workers = _workers(rng, base)
    task_plans = _tasks(rng, base)
    faults = _faults(rng, base, workers)
    restarts = tuple(round(rng.uniform(*base.replica_restart_seconds), 2) for _ in range(64))
    agent_restarts = tuple(round(rng.uniform(*base.agent_restart_seconds), 2) for _ in range(64))
    return Plan(
        seed=seed,
        profile=profile,
        workers=tuple(workers),
        tasks=tuple(task_plans),
        faults=tuple(faults),
        replica_restart_seconds=restarts,
        agent_restart_seconds=agent_restarts,
        budget_max_concurrent=base.budget_max_concurrent,
    )
