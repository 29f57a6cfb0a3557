"""What the controller's step has to look at: dirty tasks, and timers for every deadline.

- ``Dirty``: the tasks to decide again, first marked first decided: when more are
  marked than a step may decide (500 claims expiring in the same second), the
  earliest expiry is decided first instead of an arbitrary one.
- ``Timers``: one heap of deadlines (lease expiry, grace end, retry backoff,
  progress deadline, worker-Lease staleness, deferred worker and queue status) with one
  live entry per subject, the earliest: a renewal costs no heap operation; when
  an entry fires, the caller checks the current deadline and pushes a new entry
  if it moved. Timers are kept only while leading (a new leader pushes them all
  again from the store).
- ``Agenda``: both, with the wake-up of the loop, as the parts see them.
- ``Retries``: a task looked at again later, or left alone for a while, recorded
  on its record and timed on the agenda.
- ``Stats``: counters of the controller's own work, for tests and the benchmark.

Pure data structures: no I/O; the clock is injected.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from agentq.clock import Clock
from agentq.operator.store import Store
from agentq.views import Key

__all__ = [
    "REFUSED_SECONDS",
    "RETRY_SECONDS",
    "TIMER_BACKOFF",
    "TIMER_BUDGET",
    "TIMER_PUBLISH",
    "TIMER_QUEUES",
    "TIMER_TASK",
    "TIMER_WORKER",
    "UNWRITABLE_SECONDS",
    "Agenda",
    "Dirty",
    "Stats",
    "Subject",
    "Timers",
]

Subject = tuple[str, Key]  # (what kind of deadline, whose)

# Timer kinds: what a due entry asks to look at.
TIMER_TASK = "task"  # a task's claim (lease expiry, grace, progress), or a retry of a write
TIMER_BACKOFF = "backoff"  # a pending task may be granted again (backoff or pause over)
TIMER_WORKER = "worker"  # a worker Lease may have gone stale, or may be read again
TIMER_PUBLISH = "publish"  # worker status deferred by its interval or the rate limit
TIMER_QUEUES = "queues"  # AgentQueue statuses looked at again (one subject for them all)
TIMER_BUDGET = "budget"  # an AgentBudget may have room again: a step (dispatch) runs then


class Dirty:
    """A set of keys that pops them in the order they were marked (a key marked again
    while waiting keeps its place)."""

    __slots__ = ("_keys",)

    def __init__(self) -> None:
        self._keys: OrderedDict[Key, None] = OrderedDict()

    def add(self, key: Key) -> None:
        self._keys.setdefault(key, None)

    def update(self, keys: Iterable[Key]) -> None:
        for key in keys:
            self._keys.setdefault(key, None)

    def discard(self, key: Key) -> None:
        self._keys.pop(key, None)

    def pop(self) -> Key:
        """The key marked first; KeyError when empty."""
        return self._keys.popitem(last=False)[0]

    def clear(self) -> None:
        self._keys.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __iter__(self) -> Iterator[Key]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"Dirty({list(self._keys)!r})"


class Timers:
    """Deadlines on the monotonic clock: one heap, one live entry per subject (the earliest)."""

    def __init__(self) -> None:
        self.active = False  # pushes are kept only while leading
        self._heap: list[tuple[float, int, Subject]] = []
        self._due: dict[Subject, float] = {}  # the earliest live entry of each subject
        self._seq = itertools.count()
        self.pushed = 0

    def push(self, due: float, what: Subject) -> None:
        """Look at ``what`` at ``due``; an earlier live entry of it stands (it will find
        the later deadline when it fires)."""
        if not self.active:
            return
        scheduled = self._due.get(what)
        if scheduled is not None and scheduled <= due:
            return
        self._due[what] = due
        self.pushed += 1
        heapq.heappush(self._heap, (due, next(self._seq), what))

    def due(self, what: Subject) -> float | None:
        """When ``what`` will be looked at next (None: no live entry)."""
        return self._due.get(what)

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> Iterator[Subject]:
        """Every subject due at ``now``, earliest first, each once; an entry superseded by
        an earlier one that already fired is skipped."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, what = heapq.heappop(heap)
            scheduled = self._due.get(what)
            if scheduled is None or scheduled > now:
                continue
            del self._due[what]
            yield what

    def clear(self) -> None:
        self._heap.clear()
        self._due.clear()

    def __len__(self) -> int:
        return len(self._due)


@dataclass
class Stats:
    """Counters of the controller's own work, for tests and the benchmark."""

    steps: int = 0
    decisions: int = 0
    grants: int = 0
    confirm_reads: int = 0  # expiries confirmed by reading the Lease again
    confirm_lists: int = 0  # LISTs that confirmed the expiries of one worker's claims
    expiries_dropped: int = 0  # expiries a re-read of the Lease proved wrong
    conflicts: int = 0
    unknown: int = 0
    refused: int = 0  # requests the API server refused (401/403): our RBAC, not the object
    deposed: int = 0  # grants refused for an old leader epoch (another replica leads)
    worker_status_writes: int = 0
    queue_status_writes: int = 0
    stalls: int = 0
    stalled_seconds: float = 0.0
    api_silences: int = 0
    invariant_checks: int = 0
    invariant_violations: int = 0


class Agenda:
    """What the step has to look at: the dirty tasks and the timers; ``poke`` wakes it."""

    def __init__(self, poke: Callable[[], None]) -> None:
        self.dirty = Dirty()
        self.timers = Timers()
        self.poke = poke

    def decide(self, key: Key) -> None:
        """Decide ``key`` again at the next step."""
        self.dirty.add(key)
        self.poke()

    def at(self, due: float, what: Subject) -> None:
        """Look at ``what`` at ``due`` (monotonic)."""
        self.timers.push(due, what)


RETRY_SECONDS = 1.0  # after an unknown outcome, look again this much later
UNWRITABLE_SECONDS = 600.0  # after a write the API server refuses for good
REFUSED_SECONDS = 30.0  # after a request refused for our credentials (401/403): RBAC


class Retries:
    """A task looked at again later, or left alone for a while."""

    def __init__(self, store: Store, agenda: Agenda, clock: Clock) -> None:
        self.store = store
        self.agenda = agenda
        self.clock = clock

    def later(self, key: Key, delay: float = RETRY_SECONDS) -> None:
        """Decide ``key`` again ``delay`` from now (an unknown outcome, a refusal)."""
        due = self.clock.monotonic() + delay
        record = self.store.tasks.get(key)
        if record is not None:
            record.redecide_at = due
        self.agenda.at(due, (TIMER_TASK, key))

    def left_alone(self, key: Key, seconds: float = UNWRITABLE_SECONDS) -> None:
        """Decide nothing about ``key`` for ``seconds`` (its writes are refused for good),
        then look again."""
        record = self.store.tasks.get(key)
        if record is None:
            return
        until = self.clock.monotonic() + seconds
        record.unwritable_until = until
        self.store.changed.task(key, view=False)  # out of the queue until then
        self.agenda.at(until, (TIMER_TASK, key))

    def not_granted_for(self, key: Key, seconds: float) -> None:
        """A pending task is not granted again before ``seconds`` from now."""
        record = self.store.tasks.get(key)
        if record is not None:
            record.retry_at = self.clock.monotonic() + seconds
