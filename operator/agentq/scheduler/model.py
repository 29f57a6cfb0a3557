"""The values the scheduling core takes and returns.

Everything here is an immutable value checked on construction, so a bad spec
fails where it is built (in the operator's mapping of a resource) rather than
deep inside a decision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def _check_positive(what: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{what} must be a finite number > 0, got {value!r}")


@dataclass(frozen=True)
class WorkerSpec:
    """What the core knows of one AgentWorker.

    ``weight`` is its capacity weight (its share of the fleet's credit),
    ``max_in_flight`` how many tasks it may hold at once, ``paused`` the cordon
    (no new tasks, current ones continue), ``ready`` whether its worker Lease is
    fresh.
    """

    name: str
    capabilities: frozenset[str]
    weight: float = 1.0
    max_in_flight: int = 1
    paused: bool = False
    ready: bool = True

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a worker needs a name")
        if not isinstance(self.capabilities, frozenset):
            raise TypeError("capabilities must be a frozenset")
        _check_positive(f"worker {self.name!r}: weight", self.weight)
        if self.max_in_flight < 1:
            raise ValueError(
                f"worker {self.name!r}: max_in_flight must be >= 1, got {self.max_in_flight!r}"
            )

    @property
    def active(self) -> bool:
        """Ready and not paused: the worker earns credit and may be chosen."""
        return self.ready and not self.paused


@dataclass(frozen=True)
class TaskSpec:
    """A pending task: the capabilities it needs and its estimated relative cost.

    ``avoid`` names workers the task should not go back to (the workers of its
    failed attempts): the core prefers any other eligible worker and picks an
    avoided one only when no other eligible worker can take the task, so an
    avoid set never leaves a task pending that could be dispatched.
    """

    name: str
    required: frozenset[str]
    cost: float = 1.0
    avoid: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a task needs a name")
        if not isinstance(self.required, frozenset):
            raise TypeError("required must be a frozenset")
        if not isinstance(self.avoid, frozenset):
            raise TypeError("avoid must be a frozenset")
        _check_positive(f"task {self.name!r}: cost", self.cost)


@dataclass(frozen=True)
class Assignment:
    """One decision: ``task`` goes to ``worker``; ``cost`` is what it was charged."""

    task: str
    worker: str
    cost: float

    def __post_init__(self) -> None:
        _check_positive(f"assignment of {self.task!r}: cost", self.cost)


@dataclass(frozen=True)
class WorkerState:
    """A snapshot of the core's bookkeeping for one worker (for status and metrics).

    ``deficit`` is the worker's usable credit in cost units (already capped);
    ``in_flight`` / ``in_flight_cost`` the tasks it holds and their summed cost;
    ``served_cost`` the cumulative cost of the tasks it completed.
    """

    deficit: float
    in_flight: int
    in_flight_cost: float
    served_cost: float
    tasks: frozenset[str]
