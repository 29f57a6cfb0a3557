"""The workload of a scenario: when each task arrives, what it costs, what it needs.

Drawn once from the scenario's seed and replayed unchanged under every policy,
so the policies are compared on exactly the same tasks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from itertools import accumulate

from agentq.simulation.scenario import CostModel, Scenario

__all__ = ["SimTask", "draw_cost", "generate"]


@dataclass(frozen=True)
class SimTask:
    """One task of the workload."""

    name: str
    arrival: float
    cost: float
    required: frozenset[str]


def draw_cost(model: CostModel, rng: random.Random) -> float:
    """One cost drawn from ``model``."""
    if model.distribution == "fixed":
        return model.scale
    if model.distribution == "uniform":
        return rng.uniform(model.low, model.high)
    if model.distribution == "exponential":
        # An exponential can come arbitrarily close to 0; costs must stay > 0.
        return max(rng.expovariate(1.0 / model.scale), 1e-6 * model.scale)
    return model.scale * rng.paretovariate(model.alpha)


def generate(scenario: Scenario) -> list[SimTask]:
    """The scenario's tasks in arrival order (Poisson arrivals at ``scenario.rate``)."""
    rng = random.Random(scenario.seed)
    demands = scenario.capability_mix
    bounds = list(accumulate(d.share for d in demands))
    rate = scenario.rate
    width = len(str(scenario.tasks))
    now = 0.0
    tasks = []
    for index in range(scenario.tasks):
        now += rng.expovariate(rate)
        cost = draw_cost(scenario.cost, rng)
        pick = rng.uniform(0.0, bounds[-1])
        demand = next((d for d, b in zip(demands, bounds, strict=True) if pick <= b), demands[-1])
        tasks.append(SimTask(f"task-{index:0{width}d}", now, cost, demand.required))
    return tasks
