"""The dispatch core: weighted deficit round-robin with capability matching.

Pure Python, no I/O, no clock, no randomness (an import-linter contract keeps
kopf and kubernetes out). The operator feeds it workers and in-flight tasks,
asks it to :meth:`~Scheduler.plan` a batch of pending tasks, commits each
returned :class:`Assignment` with a compare-and-swap write and tells the core
which commits failed (:meth:`~Scheduler.abort`). The rule, its state and its
guarantees are written down in ``docs/scheduling.md``.

- :mod:`agentq.scheduler.model`: the values (specs, assignments, snapshots).
- :mod:`agentq.scheduler.ledger`: the state and every transition of it.
- :mod:`agentq.scheduler.fast`: :class:`Scheduler`, the rule on a capability-group index.
- :mod:`agentq.scheduler.reference`: the same rule by a full scan (for tests and benchmarks).
- :mod:`agentq.scheduler.tenancy`: the level above, which queue of a queue tree is
  served next (hierarchical DRR by cost, ``docs/tenancy.md``).
"""

from agentq.scheduler.fast import Scheduler
from agentq.scheduler.ledger import DEFAULT_CAP_TASKS, UnknownWorkerError
from agentq.scheduler.model import Assignment, TaskSpec, WorkerSpec, WorkerState
from agentq.scheduler.reference import ReferenceScheduler

__all__ = [
    "DEFAULT_CAP_TASKS",
    "Assignment",
    "ReferenceScheduler",
    "Scheduler",
    "TaskSpec",
    "UnknownWorkerError",
    "WorkerSpec",
    "WorkerState",
]
