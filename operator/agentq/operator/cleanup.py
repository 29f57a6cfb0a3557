"""Finished tasks deleted ``ttlSecondsAfterFinished`` after they finished (as a Job's TTL).

The store keeps no record of a settled finished task (``claims.settled``): only this
part remembers it, as one small entry -- its uid, its resourceVersion, its phase and
when it is due, on our monotonic clock -- so the operator's memory for finished tasks
is a few hundred bytes each, and at most ``limit`` entries, whatever the TTL.

- **When**: ``status.finishedAt`` + the task's ``ttlSecondsAfterFinished`` (else the
  operator's ``TTL_AFTER_FINISHED``), converted once to our monotonic clock, at most
  the TTL ahead: a wall clock stepped back holds no task for longer than its TTL. A
  task naming AgentBudgets no sooner than ``HOLD_SECONDS`` (61 s) after it finished,
  whatever its TTL: a new leader restores a budget's last minute from its tasks'
  statuses (docs/budgets.md).
- **How**: a DELETE with preconditions on the uid and the resourceVersion it was seen
  at -- a task re-created under the name, or changed since (a requeue), is not
  deleted; its next event says what it is now. Its Leases go with it (owner
  references: the garbage collector). Deletes take low-priority slots, at most
  ``BATCH`` in flight: tidying up never holds up a decision.
- **More than ``limit`` finished tasks**: the ones over it are not remembered; once
  the remembered ones have gone (below nine tenths of the limit) the tasks are
  listed again (``relist``, the watch's LIST), at most every ``RELIST_SECONDS``, and
  the rest are remembered then; a relist that fails is tried again
  ``RELIST_RETRY_SECONDS`` later.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from agentq.clock import Clock
from agentq.operator import metrics
from agentq.operator.gate import RequestGate
from agentq.operator.port import Kube, KubeError, Status
from agentq.operator.work import RETRY_SECONDS, Stats
from agentq.scheduler.budgets import HOLD_SECONDS
from agentq.views import Key, TaskView

__all__ = ["BATCH", "RELIST_RETRY_SECONDS", "RELIST_SECONDS", "Cleanup"]

log = logging.getLogger("agentq.controller")

BATCH = 16  # deletes in flight at once
RELIST_SECONDS = 600.0  # least time between two relists after an overflow
RELIST_RETRY_SECONDS = 30.0  # after a relist that failed
COMPACT_SLACK = 1024  # stale heap items allowed beyond twice the entries


@dataclass(slots=True)
class _Entry:
    uid: str
    resource_version: str
    phase: str
    due: float  # monotonic
    ttl: float  # the TTL it is due by: a change of it decides again
    deleting: bool = False


class Cleanup:
    """When each finished task is deleted, and the deletes (see the module docstring)."""

    def __init__(
        self,
        *,
        gate: RequestGate,
        kube: Kube,
        clock: Clock,
        stats: Stats,
        default_ttl: float,
        limit: int,
    ) -> None:
        self.gate = gate
        self.kube = kube
        self.clock = clock
        self.stats = stats
        self.default_ttl = default_ttl
        self.limit = limit
        # The watch's LIST again (main sets it): finished tasks over the limit are seen
        # again once there is room. None: nothing to list with (tests).
        self.relist: Callable[[], Coroutine[Any, Any, None]] | None = None
        self.entries: dict[Key, _Entry] = {}
        self._phases: Counter[str] = Counter()  # of the entries
        self._heap: list[tuple[float, int, Key]] = []
        self._seq = itertools.count()
        self.overflowed = False
        self._relisted = -RELIST_SECONDS
        self._deletes: set[asyncio.Task[None]] = set()  # in flight

    # -- what the store saw -------------------------------------------------------------

    def saw(self, key: Key, view: TaskView | None) -> None:
        """``view``: the task finished and settled (None: gone, or not finished)."""
        if view is None:
            self._forget(key)  # its heap entry is dropped when it comes up
            return
        spec_ttl = view.spec.ttl_seconds_after_finished
        ttl = self.default_ttl if spec_ttl is None else float(spec_ttl)
        now = self.clock.monotonic()
        finished = view.status.finished_at
        left = ttl
        if finished is not None:
            left = (finished - self.clock.now()).total_seconds() + ttl
        due = now + max(0.0, min(left, ttl))
        if view.spec.budgets:
            # Its last attempt's usage counts for a minute after its end: kept that long.
            held = float(HOLD_SECONDS)
            if finished is not None:
                held = (finished - self.clock.now()).total_seconds() + HOLD_SECONDS
            due = max(due, now + max(0.0, min(held, HOLD_SECONDS)))
        entry = self.entries.get(key)
        phase = (view.phase.value if view.phase else "") or ""
        if entry is not None and entry.uid == view.uid:
            self._phases[entry.phase] -= 1
            self._phases[phase] += 1
            entry.resource_version, entry.phase = view.resource_version, phase
            if entry.ttl == ttl and entry.due <= due:
                return  # already due no later (the first sight decides, for this TTL)
            entry.due, entry.ttl = due, ttl
            if entry.deleting:
                return  # its delete, under way, is refused (an older version): due again then
        else:
            if entry is None and len(self.entries) >= self.limit:
                self.overflowed = True  # remembered at a relist, once there is room
                return
            self._forget(key)
            entry = self.entries[key] = _Entry(view.uid, view.resource_version, phase, due, ttl)
            self._phases[phase] += 1
        heapq.heappush(self._heap, (due, next(self._seq), key))
        self._compact()

    def _forget(self, key: Key) -> None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            self._phases[entry.phase] -= 1
            self._compact()

    def _compact(self) -> None:
        """The heap built again from the entries once most of it is stale (tasks deleted,
        requeued or seen again before they were due; a standby, which deletes nothing,
        never pops it): held to the entries' count, not to every task ever seen in a
        TTL."""
        if len(self._heap) <= 2 * len(self.entries) + COMPACT_SLACK:
            return
        self._heap = [
            (entry.due, next(self._seq), key)
            for key, entry in self.entries.items()
            if not entry.deleting
        ]
        heapq.heapify(self._heap)

    def reset(self) -> None:
        """This replica starts leading: deletes cancelled with the last lead are due again
        (later, if the TTL was raised meanwhile)."""
        now = self.clock.monotonic()
        for key, entry in self.entries.items():
            if entry.deleting:
                entry.deleting = False
                entry.due = max(now, entry.due)
                heapq.heappush(self._heap, (entry.due, next(self._seq), key))

    def holds(self, key: Key, uid: str | None) -> bool:
        """Whether ``key`` is remembered as a finished task of this ``uid``."""
        entry = self.entries.get(key)
        return entry is not None and uid is not None and entry.uid == uid

    # -- in the step --------------------------------------------------------------------

    @property
    def deleting(self) -> int:
        return len(self._deletes)

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def run(self) -> None:
        """Start the deletes that are due (at most BATCH in flight), and a relist after an
        overflow once there is room."""
        now = self.clock.monotonic()
        heap = self._heap
        while heap and heap[0][0] <= now and self.deleting < BATCH:
            due, _, key = heapq.heappop(heap)
            entry = self.entries.get(key)
            if entry is None or entry.due != due or entry.deleting:
                continue  # gone, or due at another time (a later heap entry)
            entry.deleting = True
            delete = self.gate.spawn(self._delete(key, entry))
            self._deletes.add(delete)
            delete.add_done_callback(self._deletes.discard)
        if (
            self.overflowed
            and self.relist is not None
            and len(self.entries) < self.limit * 0.9
            and now - self._relisted >= RELIST_SECONDS
        ):
            self.overflowed = False
            self._relisted = now
            self.gate.spawn(self._relist(self.relist))

    async def _relist(self, relist: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """The relist; one that fails (or is cancelled with the lead) is due again, after
        ``RELIST_RETRY_SECONDS``: the tasks it was to find are remembered nowhere else."""
        try:
            await relist()
        except BaseException as err:
            self.overflowed = True
            self._relisted = self.clock.monotonic() - RELIST_SECONDS + RELIST_RETRY_SECONDS
            if isinstance(err, Exception):
                log.warning("listing the tasks again for the cleanup failed: %s", err)
                return
            raise

    async def _delete(self, key: Key, entry: _Entry) -> None:
        namespace, name = key
        sent = entry.resource_version
        try:
            reply = await self.gate.call_low(
                self.kube.delete_task, namespace, name, entry.uid, sent
            )
        except KubeError as err:
            entry.deleting = False
            log.info("deleting finished task %s/%s had an unknown outcome: %s", *key, err)
            self._again(key, entry, RETRY_SECONDS)
            return
        # Cancelled (the lead lost), the entry stays ``deleting``: due again at ``reset``.
        entry.deleting = False
        if reply.status is Status.CONFLICT and entry.resource_version != sent:
            # Changed while the delete was out, and still finished and settled (a label
            # added, a cancel ignored): its event moved the entry on already, so no
            # later event would bring it back. Deleted again, as it is now, when it is
            # due (later if its TTL was raised meanwhile).
            self._again(key, entry, 0.0)
            return
        if reply.ok or reply.status in (Status.GONE, Status.CONFLICT):
            # Deleted; or gone already; or changed since (its event says what it is now).
            if reply.ok:
                metrics.TASKS_DELETED.inc()
            if self.entries.get(key) is entry:
                self._forget(key)
            return
        log.error("deleting finished task %s/%s refused: %s", *key, reply.message)
        if reply.status is Status.FORBIDDEN:
            self.stats.refused += 1
        self._again(key, entry, 600.0)

    def _again(self, key: Key, entry: _Entry, delay: float) -> None:
        if self.entries.get(key) is entry:
            # No sooner than it is due: its TTL may have been raised while it was out.
            entry.due = max(entry.due, self.clock.monotonic() + delay)
            heapq.heappush(self._heap, (entry.due, next(self._seq), key))

    # -- for the gauges -----------------------------------------------------------------

    def phases(self) -> Counter[str]:
        """Finished tasks remembered, by phase."""
        return +self._phases

    def __len__(self) -> int:
        return len(self.entries)
