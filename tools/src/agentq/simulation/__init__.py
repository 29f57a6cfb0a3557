"""``agentq simulate``: agentq's dispatch rule against plain baselines, in simulated time.

- :mod:`agentq.simulation.scenario`: fleets and workloads (YAML, flags, presets).
- :mod:`agentq.simulation.workload`: the tasks a scenario generates from its seed.
- :mod:`agentq.simulation.baselines`: round-robin and least-loaded by count.
- :mod:`agentq.simulation.engine`: the discrete-event simulation of one policy.
- :mod:`agentq.simulation.metrics`: shares, Jain's index, waits, starvation.
- :mod:`agentq.simulation.report`: tables, JSON, Markdown and plots.
- :mod:`agentq.simulation.tenants`: teams flooding AgentQueues of one shared pool,
  the queue level's hierarchical DRR against one queue of every team's tasks.
- :mod:`agentq.simulation.command`: the click command.

The scheduling core is used as the operator uses it; only time is simulated.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentq.simulation.baselines import POLICIES
from agentq.simulation.engine import Run, simulate
from agentq.simulation.metrics import Summary, summarize
from agentq.simulation.scenario import Scenario
from agentq.simulation.workload import generate

__all__ = ["compare"]


def compare(
    scenario: Scenario, policies: Sequence[str] = tuple(POLICIES)
) -> list[tuple[Run, Summary]]:
    """Run the scenario's workload under each named policy (same tasks for all)."""
    workload = generate(scenario)
    results = []
    for name in policies:
        run = simulate(scenario, workload, POLICIES[name](), name=name)
        results.append((run, summarize(run)))
    return results
