"""What the leader publishes of each AgentBudget: its status and its gauges (docs/budgets.md).

The status is a report for people, and what a new leader resumes from: its
``window`` (the last minute's placements in 5-second buckets) and
``throttledUntil`` (``budgeting.Budgets.restore``). The rest -- ``inUse``,
``usedRequests``/``usedTokens``, ``reservedRequests``/``reservedTokens``,
``available*``, ``waiting`` -- is the book's state at the write; conditions
``Saturated`` (True while tasks naming it wait and it has no room: reason
``Throttled``, ``MaxConcurrent``, ``RequestsPerMinute`` or ``TokensPerMinute``) and
``Throttled`` (True until ``throttledUntil``, reason ``RetryAfter``), each keeping
its ``lastTransitionTime`` while its status stays.

Written at most every ``BUDGET_STATUS_INTERVAL`` (2 s) per budget, and only when
what it would say changed; one write per budget at a time, through the request
gate (only a leader's are sent). A report, not a decision: no precondition, last
write wins. The gauges (``agentq_budget_*``) are set at each look; a deleted
budget's series go with it.
"""

from __future__ import annotations

import datetime
import logging
import math
from dataclasses import dataclass
from typing import Any

from agentq.clock import Clock, rfc3339
from agentq.models import BUDGET_PLURAL, AgentBudgetStatus
from agentq.operator import metrics
from agentq.operator.cores import Cores
from agentq.operator.gate import RequestGate
from agentq.operator.indexes import Indexes
from agentq.operator.port import Kube, KubeError, Reply, Status
from agentq.operator.store import Store
from agentq.operator.work import REFUSED_SECONDS, RETRY_SECONDS, UNWRITABLE_SECONDS, Agenda
from agentq.scheduler.budgets import (
    ESTIMATE_EXCEEDS_LIMIT,
    MAX_CONCURRENT,
    REQUESTS_PER_MINUTE,
    THROTTLED,
    TOKENS_PER_MINUTE,
    BudgetState,
    Window,
)

__all__ = ["BUDGET_STATUS_INTERVAL", "BudgetStatuses", "status_of"]

log = logging.getLogger("agentq.controller")

#: The least time between two status writes of one budget (docs/budgets.md).
BUDGET_STATUS_INTERVAL = 2.0

_LOOK = ("budgets", ("", ""))  # the timer subject of the next look


def _wall(at: float, now: float, wall: datetime.datetime) -> str:
    return rfc3339(wall + datetime.timedelta(seconds=at - now))


def _saturated(state: BudgetState, waiting: int, now: float) -> tuple[str, str, str]:
    """(status, reason, message) of the condition Saturated."""
    if not waiting:
        return "False", "NoneWaiting", "no task waits for it"
    if state.throttled_until is not None and state.throttled_until > now:
        return "True", THROTTLED, f"{waiting} task(s) wait: paused after a provider's 429"
    full = [
        (state.available_concurrency, MAX_CONCURRENT, "every concurrent claim is held"),
        (state.available_requests, REQUESTS_PER_MINUTE, "no requests left in the last minute"),
        (state.available_tokens, TOKENS_PER_MINUTE, "no tokens left in the last minute"),
    ]
    for available, reason, why in full:
        if available == 0:
            return "True", reason, f"{waiting} task(s) wait: {why}"
    return "False", "HasRoom", f"{waiting} task(s) pending, and it has room"


def conditions_of(
    shown: AgentBudgetStatus, state: BudgetState, waiting: int, now: float, stamp: str
) -> list[dict[str, Any]]:
    """Saturated and Throttled as they should be; a condition whose status stays keeps
    its lastTransitionTime."""
    throttled = state.throttled_until is not None and state.throttled_until > now
    wanted = [
        ("Saturated", *_saturated(state, waiting, now)),
        (
            "Throttled",
            "True" if throttled else "False",
            "RetryAfter" if throttled else "NotThrottled",
            "a provider answered 429: no grant until throttledUntil"
            if throttled
            else "no provider's 429 pauses it",
        ),
    ]
    before = {c.type: c for c in shown.conditions or []}
    out = []
    for kind, status, reason, message in wanted:
        old = before.get(kind)
        since = stamp
        if old is not None and old.status.value == status:
            since = rfc3339(old.last_transition_time)
        out.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": since,
            }
        )
    return out


def status_of(
    state: BudgetState,
    window: Window,
    *,
    waiting: int,
    generation: int | None,
    now: float,
    wall: datetime.datetime,
    shown: AgentBudgetStatus | None = None,
) -> dict[str, Any]:
    """The status a budget should show (a merge patch: absent limits cleared)."""
    throttled = state.throttled_until
    stamp = rfc3339(wall)
    conditions = conditions_of(shown or AgentBudgetStatus(), state, waiting, now, stamp)
    return {
        "conditions": conditions,
        "inUse": state.in_use,
        "usedRequests": state.used.requests,
        "usedTokens": state.used.tokens,
        "reservedRequests": state.reserved.requests,
        "reservedTokens": state.reserved.tokens,
        "availableRequests": state.available_requests,
        "availableTokens": state.available_tokens,
        "availableConcurrency": state.available_concurrency,
        "throttledUntil": None if throttled is None else _wall(throttled, now, wall),
        "waiting": waiting,
        "window": {
            "asOf": _wall(window.as_of, now, wall),
            "bucketSeconds": window.bucket_seconds,
            "buckets": [
                {"start": _wall(start, now, wall), "requests": u.requests, "tokens": u.tokens}
                for start, u in window.buckets
            ],
        },
        "observedGeneration": generation,
    }


def _shown(want: dict[str, Any]) -> tuple[Any, ...]:
    """What a status says, but when it was written (a write only for a change)."""
    window = want["window"]
    return (
        *(v for k, v in sorted(want.items()) if k not in ("window", "conditions")),
        tuple((b["requests"], b["tokens"]) for b in window["buckets"]),
        tuple((c["type"], c["status"], c["reason"], c["message"]) for c in want["conditions"]),
    )


@dataclass
class _Budget:
    uid: str
    written: tuple[Any, ...] | None = None  # what the last write said
    written_at: float = -math.inf
    writing: bool = False
    hold_until: float = -math.inf


class BudgetStatuses:
    """Each AgentBudget's status and gauges (see the module docstring)."""

    def __init__(
        self,
        *,
        store: Store,
        indexes: Indexes,
        cores: Cores,
        agenda: Agenda,
        gate: RequestGate,
        kube: Kube,
        clock: Clock,
        interval: float = BUDGET_STATUS_INTERVAL,
    ) -> None:
        self.store = store
        self.indexes = indexes
        self.cores = cores
        self.agenda = agenda
        self.gate = gate
        self.kube = kube
        self.clock = clock
        self.interval = interval
        self.budgets: dict[str, _Budget] = {}
        self._series: set[str] = set()
        self._looked = -math.inf

    def reset(self) -> None:
        """This replica starts leading (its writes of before were cancelled)."""
        self.budgets.clear()
        self._looked = -math.inf

    def publish(self) -> None:
        """Compare each budget's status with the book at most once an interval; write the
        changed ones."""
        views = self.store.budgets
        budgets = self.cores.budgets
        if not (views or self._series) or not budgets.restored:
            return
        now = self.clock.monotonic()
        if now < self._looked + self.interval:
            return
        self._looked = now
        self.agenda.at(now + self.interval, _LOOK)  # the window slides with time
        wall = self.clock.now()
        for name in self._series - views.keys():
            metrics.forget_budget(name)
            self._series.discard(name)
        for name in [n for n in self.budgets if n not in views]:
            del self.budgets[name]
        waiting = self._waiting()
        oversized = self._oversized()
        for name, view in views.items():
            state = budgets.book.state(name, now)
            if state is None or view.spec is None:
                continue
            self._gauges(name, state, waiting.get(name, 0))
            metrics.BUDGET_OVERSIZED.labels(name).set(oversized.get(name, 0))
            budget = self.budgets.get(name)
            if budget is None or budget.uid != view.uid:
                budget = self.budgets[name] = _Budget(uid=view.uid)
            if budget.writing or now < budget.hold_until:
                continue
            want = status_of(
                state,
                budgets.book.window(name, now),
                waiting=waiting.get(name, 0),
                generation=view.generation,
                now=now,
                wall=wall,
                shown=view.status,
            )
            said = _shown(want)
            if said == budget.written:
                continue
            budget.written, budget.written_at, budget.writing = said, now, True
            self.gate.spawn(self._write(name, budget, want))

    def _waiting(self) -> dict[str, int]:
        """Pending tasks per budget they name and wait for (not those with a verdict)."""
        counts: dict[str, int] = {}
        queue = self.indexes.queue
        for lane in queue.lanes():
            for (_, named), entry in queue.sets(lane).items():
                for name in named:
                    counts[name] = counts.get(name, 0) + len(entry.members)
        return counts

    def _oversized(self) -> dict[str, int]:
        """Tasks per budget whose estimate exceeds its per-minute limit (a verdict)."""
        counts: dict[str, int] = {}
        for key, (reason, _) in self.indexes.budget_held.items():
            record = self.store.tasks.get(key)
            if reason != ESTIMATE_EXCEEDS_LIMIT or record is None:
                continue
            for entry in record.view.spec.budgets or ():
                known = self.store.budgets.get(entry.name)
                spec = known.spec if known is not None else None
                if spec is None:
                    continue
                rpm, tpm = spec.requests_per_minute, spec.tokens_per_minute
                if (rpm is not None and entry.requests > rpm) or (
                    tpm is not None and entry.tokens > tpm
                ):
                    counts[entry.name] = counts.get(entry.name, 0) + 1
        return counts

    def _gauges(self, name: str, state: BudgetState, waiting: int) -> None:
        self._series.add(name)
        spec = state.spec
        limits = {
            "requests": spec.requests_per_minute if spec else None,
            "tokens": spec.tokens_per_minute if spec else None,
            "concurrent": spec.max_concurrent if spec else None,
        }
        used = {"requests": state.used.requests, "tokens": state.used.tokens}
        used["concurrent"] = state.in_use
        reserved = {"requests": state.reserved.requests, "tokens": state.reserved.tokens}
        available = {
            "requests": state.available_requests,
            "tokens": state.available_tokens,
            "concurrent": state.available_concurrency,
        }
        for resource, limit in limits.items():
            metrics.set_or_drop(metrics.BUDGET_LIMIT, (name, resource), limit)
            metrics.set_or_drop(metrics.BUDGET_AVAILABLE, (name, resource), available[resource])
            metrics.BUDGET_USED.labels(name, resource).set(used[resource])
        for resource, amount in reserved.items():
            metrics.BUDGET_RESERVED.labels(name, resource).set(amount)
        throttled = state.throttled_until is not None and state.throttled_until > (
            self.clock.monotonic()
        )
        metrics.BUDGET_THROTTLED.labels(name).set(1 if throttled else 0)
        metrics.BUDGET_WAITING.labels(name).set(waiting)

    async def _write(self, name: str, budget: _Budget, status: dict[str, Any]) -> None:
        reply: Reply | None = None
        try:
            reply = await self.gate.call(
                self.kube.patch_status, BUDGET_PLURAL, "", name, None, status
            )
        except KubeError as err:
            log.info("status of AgentBudget %s: unknown outcome (%s)", name, err)
        finally:
            budget.writing = False
        if reply is None:
            budget.written = None
            budget.hold_until = self.clock.monotonic() + RETRY_SECONDS
        elif reply.status is Status.INVALID:
            metrics.UNPROCESSABLE.labels("AgentBudget", "StatusRefused").inc()
            log.error("status of AgentBudget %s refused: %s", name, reply.message)
            budget.hold_until = self.clock.monotonic() + UNWRITABLE_SECONDS
        elif reply.status is Status.FORBIDDEN:
            log.error("status of AgentBudget %s refused: %s", name, reply.message)
            budget.hold_until = self.clock.monotonic() + REFUSED_SECONDS
        elif reply.ok and reply.body is not None:
            self.store.observe_budget(reply.body)
        else:
            budget.written = None  # gone, or a conflict: compared again
