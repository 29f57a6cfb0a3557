"""The figures a simulation reports, computed from a :class:`~agentq.simulation.engine.Run`.

- share of cost per worker vs its weight share: a worker's entitlement is the
  total served cost times ``weight * uptime / sum(weight * uptime)`` (uptime
  matters only for a worker that crashed); ``max_share_error`` is the largest
  ``|served - entitlement|``, in units of the workload's largest task cost (the
  unit of the DRR bound);
- Jain's fairness index of the weight-normalized service
  ``served / (weight * uptime)``: 1 when every worker got exactly its share,
  ``1/n`` when one worker got everything;
- makespan: when the last task completed;
- queue wait: per dispatched task, the total time it spent queued (first
  arrival to grant, plus reclaim to re-grant); p50 and p99, linearly
  interpolated;
- starved: tasks never dispatched.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from agentq.simulation.engine import Run

__all__ = ["Summary", "WorkerShare", "jain_index", "percentile", "summarize"]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100), linear between closest ranks; ``None`` if empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def jain_index(values: Sequence[float]) -> float | None:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)``; ``None`` if undefined."""
    squares = math.fsum(x * x for x in values)
    if not values or squares == 0:
        return None
    return math.fsum(values) ** 2 / (len(values) * squares)


@dataclass(frozen=True)
class WorkerShare:
    """One worker's share of the served cost against its weight share."""

    name: str
    weight_share: float
    share: float
    error: float  # (served - entitlement) / max task cost


@dataclass(frozen=True)
class Summary:
    """One row of the simulator's table (the ``--json`` keys are the field names)."""

    policy: str
    max_share_error: float | None
    jain_index: float | None
    makespan: float
    p50_wait: float | None
    p99_wait: float | None
    starved: int
    unfinished: int
    reclaims: int
    shares: tuple[WorkerShare, ...]

    def as_dict(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "max_share_error": self.max_share_error,
            "jain_index": self.jain_index,
            "makespan": self.makespan,
            "p50_wait": self.p50_wait,
            "p99_wait": self.p99_wait,
            "starved": self.starved,
            "unfinished": self.unfinished,
            "reclaims": self.reclaims,
            "shares": {
                s.name: {"weight_share": s.weight_share, "share": s.share, "error": s.error}
                for s in self.shares
            },
        }


def summarize(run: Run) -> Summary:
    """The figures of one run."""
    counted = [w for w in run.workers if w.uptime > 0]
    entitled = math.fsum(w.weight * w.uptime for w in counted)
    total = math.fsum(w.served for w in counted)
    shares: list[WorkerShare] = []
    for w in counted:
        weight_share = w.weight * w.uptime / entitled
        shares.append(
            WorkerShare(
                name=w.name,
                weight_share=weight_share,
                share=w.served / total if total else 0.0,
                error=(w.served - weight_share * total) / run.max_cost,
            )
        )
    return Summary(
        policy=run.policy,
        max_share_error=max((abs(s.error) for s in shares), default=None),
        jain_index=jain_index([w.served / (w.weight * w.uptime) for w in counted]),
        makespan=run.makespan,
        p50_wait=percentile(run.waits, 50),
        p99_wait=percentile(run.waits, 99),
        starved=run.starved,
        unfinished=run.unfinished,
        reclaims=run.reclaims,
        shares=tuple(shares),
    )
