"""The dispatch rule as written, by a full scan of the fleet: the yardstick for the index.

:class:`ReferenceScheduler` shares the ledger (state and transitions) with the
fast :class:`agentq.scheduler.Scheduler` and selects by the plainest reading of
``docs/scheduling.md``: look at every worker, keep those that may take the task,
take the least key. It costs O(n) per decision; tests and the benchmark compare
the fast index against it decision by decision.
"""

from __future__ import annotations

import math

from agentq.scheduler.ledger import Ledger, _Worker

__all__ = ["ReferenceScheduler"]


class ReferenceScheduler(Ledger):
    """Weighted deficit round-robin with capability matching, by a full scan."""

    # A full scan keeps no index: membership and changes need no bookkeeping.
    def _on_added(self, worker: _Worker) -> None:
        pass

    def _on_removed(self, worker: _Worker) -> None:
        pass

    def _on_changed(self, worker: _Worker) -> None:
        pass

    def _select(
        self, required: frozenset[str], threshold: float, avoid: frozenset[str]
    ) -> tuple[_Worker | None, float]:
        best: _Worker | None = None  # the least key outside ``avoid``
        best_key: tuple[float, str] | None = None
        fallback: _Worker | None = None  # the least key inside ``avoid``
        fallback_key: tuple[float, str] | None = None
        floor = math.inf
        for worker in self._workers.values():
            spec = worker.spec
            # Eligible: ready, not paused, below max_in_flight, capabilities cover the task.
            if not worker.available or not required <= spec.capabilities:
                continue
            # Credit above the cap does not count: the tag is at least V - K.
            tag = max(worker.tag, threshold)
            floor = min(floor, tag)
            key = (tag + worker.load / spec.weight, spec.name)
            if spec.name in avoid:
                if fallback_key is None or key < fallback_key:
                    fallback, fallback_key = worker, key
            elif best_key is None or key < best_key:
                best, best_key = worker, key
        # An avoided worker only when no other eligible worker can take the task.
        return (best if best is not None else fallback), floor
