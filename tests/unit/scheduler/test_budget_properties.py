"""Properties of the budget core (docs/budgets.md), by hypothesis, over random limits,
estimates, cumulative reports (final or not), ends of claims, refunds, throttles, limit
changes, persisted windows, restarts and times.

Every grant is judged against an independent record of the operations (not the book's
own sums):

- the sliding minute: at each grant, for each budget and dimension it spends, the
  attempts granted in the minute before it (``(a - 60, a]``), each at its accounted
  amount then (``max(estimate, reported)``, or the report after a final one), plus
  the new estimate, are at most the limit -- across restarts too, the grants of
  both leaders counted;
- ``maxConcurrent`` is never exceeded at a grant;
- a throttle stops every grant on its budget until its end;
- a refused grant's ``until`` is exact: at that time, nothing else happening, it is
  admitted;
- a debit followed by its refund leaves every budget as a twin book that never saw it;
- a restore (a new leader, from what the task statuses and the last persisted window
  show, including attempts whose tasks were deleted before that window was written)
  never lets a window hold more than the limit.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentq.scheduler.budgets import (
    WINDOW_SECONDS,
    BudgetBook,
    BudgetSpec,
    Need,
    NotAdmitted,
    OpenGrant,
    Placement,
    Usage,
    Window,
)

pytestmark = pytest.mark.unit

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
BUDGETS = ("a", "b")

limits = st.tuples(
    st.none() | st.integers(1, 8),  # requests per minute
    st.none() | st.integers(10, 100),  # tokens per minute
    st.none() | st.integers(1, 3),  # max concurrent
)
steps = st.one_of(
    st.just(0.0),
    st.sampled_from([0.5, 1.0, 5.0, 30.0, 60.0, 61.0]),
    st.floats(min_value=0.0, max_value=20.0, allow_nan=False, allow_infinity=False),
)
needs = st.dictionaries(
    st.sampled_from(BUDGETS),
    st.builds(Need, requests=st.integers(0, 3), tokens=st.integers(0, 60)),
    min_size=1,
    max_size=2,
)


@dataclass(frozen=True)
class Grant:
    needs: dict[str, Need]
    dt: float
    wait_out: bool  # refused with a time: wait for it, then it must go


@dataclass(frozen=True)
class Report:
    pick: int
    budget: str
    requests: int
    tokens: int
    final: bool
    dt: float


@dataclass(frozen=True)
class End:
    pick: int
    dt: float


@dataclass(frozen=True)
class Refund:
    needs: dict[str, Need]
    dt: float


@dataclass(frozen=True)
class Throttle:
    budget: str
    seconds: float
    dt: float


@dataclass(frozen=True)
class Limits:
    budget: str
    limits: tuple[int | None, int | None, int | None]
    dt: float


@dataclass(frozen=True)
class Persist:
    """The leader writes the budgets' windows into their statuses."""

    dt: float


@dataclass(frozen=True)
class Crash:
    """A new leader restores from the statuses; tasks of attempts that ended before the
    last window was written may have been deleted meanwhile."""

    deleted: bool
    dt: float


Op = Grant | Report | End | Refund | Throttle | Limits | Persist | Crash

ops = st.lists(
    st.one_of(
        st.builds(Grant, needs=needs, dt=steps, wait_out=st.booleans()),
        st.builds(
            Report,
            pick=st.integers(0, 50),
            budget=st.sampled_from(BUDGETS),
            requests=st.integers(0, 3),
            tokens=st.integers(0, 80),
            final=st.booleans(),
            dt=steps,
        ),
        st.builds(End, pick=st.integers(0, 50), dt=steps),
        st.builds(Refund, needs=needs, dt=steps),
        st.builds(
            Throttle,
            budget=st.sampled_from(BUDGETS),
            seconds=st.floats(0.0, 30.0, allow_nan=False),
            dt=steps,
        ),
        st.builds(Limits, budget=st.sampled_from(BUDGETS), limits=limits, dt=steps),
        st.builds(Persist, dt=steps),
        st.builds(Crash, deleted=st.booleans(), dt=steps),
    ),
    max_size=60,
)


@dataclass
class Attempt:
    """The independent record of one grant."""

    at: float
    needs: dict[str, Need]
    reported: dict[str, Usage] = field(default_factory=dict)
    final: set[str] = field(default_factory=set)
    ended_at: float | None = None

    def accounted(self, budget: str) -> Usage:
        reported = self.reported.get(budget, Usage())
        if budget in self.final:
            return reported
        need = self.needs[budget]
        return Usage(max(need.requests, reported.requests), max(need.tokens, reported.tokens))


def spec(name: str, limit: tuple[int | None, int | None, int | None]) -> BudgetSpec:
    return BudgetSpec(name, *limit)


class Run:
    """One book driven by the operations, checked against the record at every grant."""

    def __init__(self, limits_of: dict[str, tuple[int | None, int | None, int | None]]) -> None:
        self.specs = {name: spec(name, limit) for name, limit in limits_of.items()}
        self.book = self._fresh_book()
        self.attempts: dict[int, Attempt] = {}
        self.open: list[int] = []
        self.throttles: dict[str, float] = {}
        self.persisted: tuple[float, dict[str, Window]] | None = None
        self.now = 0.0
        self.next_id = 0
        self.grants = 0
        self.restores = 0

    def _fresh_book(self) -> BudgetBook:
        book = BudgetBook()
        for budget_spec in self.specs.values():
            book.upsert_budget(budget_spec)
        return book

    # -- the checks -------------------------------------------------------------------

    def check_grant(self, wanted: dict[str, Need], a: float) -> None:
        for name, need in wanted.items():
            budget_spec = self.specs[name]
            assert self.throttles.get(name, -math.inf) <= a, f"{name} granted while throttled"
            holding = sum(1 for i in self.open if name in self.attempts[i].needs)
            if budget_spec.max_concurrent is not None:
                assert holding < budget_spec.max_concurrent, f"{name}: over maxConcurrent"
            in_minute = [
                attempt
                for attempt in self.attempts.values()
                if name in attempt.needs and a - WINDOW_SECONDS < attempt.at <= a
            ]
            for limit, amount, part in (
                (budget_spec.requests_per_minute, need.requests, "requests"),
                (budget_spec.tokens_per_minute, need.tokens, "tokens"),
            ):
                if limit is None or amount == 0:
                    continue
                total = amount + sum(getattr(x.accounted(name), part) for x in in_minute)
                assert total <= limit, f"{name}: {total} {part} in the minute before {a}"

    # -- the operations ---------------------------------------------------------------

    def grant(self, wanted: dict[str, Need], wait_out: bool) -> None:
        wait = self.book.admits(wanted, self.now)
        if wait is not None:
            with pytest.raises(NotAdmitted):
                self.book.debit(-1, wanted, self.now)
            if wait.until is not None:
                assert wait.until > self.now
            if not wait_out or wait.until is None:
                return
            self.now = wait.until
            assert self.book.admits(wanted, self.now) is None, f"still refused at {wait}"
        self.check_grant(wanted, self.now)
        grant_id = self.next_id
        self.next_id += 1
        self.book.debit(grant_id, wanted, self.now)
        self.attempts[grant_id] = Attempt(at=self.now, needs=dict(wanted))
        self.open.append(grant_id)
        self.grants += 1

    def report(self, op: Report) -> None:
        if not self.open:
            return
        grant_id = self.open[op.pick % len(self.open)]
        attempt = self.attempts[grant_id]
        if op.budget not in attempt.needs or op.budget in attempt.final:
            return  # the sidecar refuses it
        before = attempt.reported.get(op.budget, Usage())
        after = Usage(before.requests + op.requests, before.tokens + op.tokens)
        self.book.correct(grant_id, {op.budget: after}, self.now, final=op.final)
        attempt.reported[op.budget] = after
        if op.final:
            attempt.final.add(op.budget)

    def end(self, op: End) -> None:
        if not self.open:
            return
        grant_id = self.open.pop(op.pick % len(self.open))
        attempt = self.attempts[grant_id]
        accounted = self.book.release(grant_id, self.now)
        # A restored grant forgets a final report (its Lease shows only the usage): it is
        # accounted at least what the record says.
        for name in attempt.needs:
            mine, truth = accounted[name], attempt.accounted(name)
            assert mine.requests >= truth.requests and mine.tokens >= truth.tokens
            if not self.restores:
                assert mine == truth
        attempt.ended_at = self.now

    def refund(self, wanted: dict[str, Need]) -> None:
        if self.book.admits(wanted, self.now) is not None:
            return
        twin = copy.deepcopy(self.book)
        debit = self.book.debit("refunded", wanted, self.now)
        assert self.book.refund(debit)
        for name in BUDGETS:
            assert self.book.state(name, self.now) == twin.state(name, self.now)
        assert self.book.grants() == twin.grants()

    def throttle(self, op: Throttle) -> None:
        until = self.now + op.seconds
        assert self.book.throttle(op.budget, until)
        self.throttles[op.budget] = max(self.throttles.get(op.budget, -math.inf), until)

    def change(self, op: Limits) -> None:
        self.specs[op.budget] = spec(op.budget, op.limits)
        self.book.upsert_budget(self.specs[op.budget])

    def persist(self) -> None:
        self.persisted = (self.now, {name: self.book.window(name, self.now) for name in BUDGETS})

    def crash(self, op: Crash) -> None:
        written_at, windows = self.persisted if self.persisted else (-math.inf, {})
        ended = [
            Placement(name, attempt.ended_at, attempt.accounted(name))
            for attempt in self.attempts.values()
            if attempt.ended_at is not None
            # Deleted tasks: only those the written window covers.
            and not (op.deleted and attempt.ended_at < written_at)
            for name in attempt.needs
        ]
        grants = [
            OpenGrant(
                grant_id,
                self.attempts[grant_id].needs,
                granted_at=self.attempts[grant_id].at,
                usage=dict(self.attempts[grant_id].reported),
            )
            for grant_id in self.open
        ]
        self.book = self._fresh_book()
        self.book.restore(
            self.now, grants=grants, ended=ended, windows=windows, throttles=self.throttles
        )
        self.restores += 1
        for name in BUDGETS:
            state = self.book.state(name, self.now)
            assert state is not None
            assert state.in_use == sum(1 for i in self.open if name in self.attempts[i].needs)
        assert sorted(self.book.grants()) == sorted(self.open)  # type: ignore[type-var]

    def apply(self, op: Op) -> None:
        self.now += op.dt
        if isinstance(op, Grant):
            self.grant(op.needs, op.wait_out)
        elif isinstance(op, Report):
            self.report(op)
        elif isinstance(op, End):
            self.end(op)
        elif isinstance(op, Refund):
            self.refund(op.needs)
        elif isinstance(op, Throttle):
            self.throttle(op)
        elif isinstance(op, Limits):
            self.change(op)
        elif isinstance(op, Persist):
            self.persist()
        else:
            self.crash(op)


@PROPERTY
@given(first=limits, second=limits, operations=ops)
def test_budgets_hold_under_any_sequence_of_grants_reports_ends_and_restores(
    first: tuple[int | None, int | None, int | None],
    second: tuple[int | None, int | None, int | None],
    operations: list[Op],
) -> None:
    run = Run({"a": first, "b": second})
    for op in operations:
        run.apply(op)


@PROPERTY
@given(
    rpm=st.integers(1, 20),
    tpm=st.integers(100, 2000),
    arrivals=st.lists(
        st.tuples(
            st.floats(0.0, 5.0, allow_nan=False),  # time to the next arrival
            st.integers(1, 3),  # requests estimate
            st.integers(0, 100),  # tokens estimate
            st.integers(0, 300),  # tokens spent
            st.floats(0.0, 90.0, allow_nan=False),  # how long the attempt runs
        ),
        min_size=1,
        max_size=40,
    ),
    crash_after=st.integers(0, 40),
)
def test_a_restore_never_allows_a_burst(
    rpm: int,
    tpm: int,
    arrivals: list[tuple[float, int, int, int, float]],
    crash_after: int,
) -> None:
    """A saturating workload: tasks arrive and go as soon as the budget admits them, run,
    report once and end; the leader writes its window every 2 s and dies once (its
    successor restoring from the statuses and that window, the tasks ended before the
    window deleted). No minute ever holds more than the limits, over both leaders."""
    run = Run({"a": (rpm, tpm, None), "b": (None, None, None)})
    backlog: list[tuple[dict[str, Need], int, float]] = []
    ending: list[tuple[float, int, int, int]] = []  # (end, grant id, requests, tokens)
    last_persist = -math.inf
    for index, (gap, requests, tokens, spent, runs) in enumerate(arrivals):
        # (Estimates within the limits: the others wait for ever, flagged.)
        backlog.append(({"a": Need(requests=min(requests, rpm), tokens=tokens)}, spent, runs))
        horizon = run.now + gap
        while True:
            # The next thing that happens: an attempt ends, a window write, a grant try.
            ending.sort()
            next_end = ending[0][0] if ending else math.inf
            step = min(next_end, horizon, last_persist + 2.0)
            if step > run.now:
                run.now = step
            if run.now >= last_persist + 2.0:
                run.persist()
                last_persist = run.now
            while ending and ending[0][0] <= run.now:
                _, grant_id, req, tok = ending.pop(0)
                run.report(Report(run.open.index(grant_id), "a", req, tok, True, 0.0))
                run.end(End(run.open.index(grant_id), 0.0))
            while backlog and run.book.admits(backlog[0][0], run.now) is None:
                wanted, spent_tokens, duration = backlog.pop(0)
                run.grant(wanted, wait_out=False)
                ending.append(
                    (run.now + duration, run.next_id - 1, wanted["a"].requests, spent_tokens)
                )
            if run.now >= horizon:
                break
        if index == crash_after:
            run.crash(Crash(deleted=True, dt=0.0))
    assert run.grants >= 1


# -- the rule exactly, against a plain re-statement of docs/budgets.md -------------------------


class Rule:
    """The rule of docs/budgets.md for one budget, restated as plainly as possible: a list of
    placements, a dict of open attempts, two paces. Times are whole seconds here, so a
    placement at ``t`` counts while ``now < t + 61``."""

    def __init__(self, rpm: int | None, tpm: int | None, concurrent: int | None) -> None:
        self.limits = (rpm, tpm)
        self.concurrent = concurrent
        self.placed: list[tuple[float, int, int]] = []
        self.open: dict[int, tuple[Need, Usage, bool]] = {}  # need, reported, final
        self.tat = [-math.inf, -math.inf]
        self.throttled = -math.inf

    def _advance(self, index: int, now: float, amount: int) -> None:
        limit = self.limits[index]
        if limit is not None and amount > 0:
            self.tat[index] = max(self.tat[index], now) + amount * 60 / limit

    def admits(self, need: Need, now: float) -> bool:
        amounts = (need.requests, need.tokens)
        if any(
            lim is not None and amt > lim for lim, amt in zip(self.limits, amounts, strict=True)
        ):
            return False
        if self.throttled > now:
            return False
        if self.concurrent is not None and len(self.open) + 1 > self.concurrent:
            return False
        for index, (limit, amount) in enumerate(zip(self.limits, amounts, strict=True)):
            if limit is None or amount == 0:
                continue
            used = sum(p[1 + index] for p in self.placed if now < math.floor(p[0]) + 61)
            reserved = sum(
                0
                if final
                else max(0, (n.requests, n.tokens)[index] - (u.requests, u.tokens)[index])
                for n, u, final in self.open.values()
            )
            if used + reserved + amount > limit or self.tat[index] > now:
                return False
        return True

    def debit(self, grant_id: int, need: Need, now: float) -> None:
        self.open[grant_id] = (need, Usage(), False)
        self._advance(0, now, need.requests)
        self._advance(1, now, need.tokens)

    def correct(self, grant_id: int, usage: Usage, now: float, final: bool) -> None:
        need, before, was_final = self.open[grant_id]
        if was_final:
            return
        after = Usage(max(before.requests, usage.requests), max(before.tokens, usage.tokens))
        self.placed.append((now, after.requests - before.requests, after.tokens - before.tokens))
        for index in (0, 1):
            n, b, a = (
                x[index]
                for x in (
                    (need.requests, need.tokens),
                    (before.requests, before.tokens),
                    (after.requests, after.tokens),
                )
            )
            self._advance(index, now, a - max(n, b))
            limit = self.limits[index]
            if final and limit is not None and a < n:
                self.tat[index] -= (n - a) * 60 / limit
        self.open[grant_id] = (need, after, final)

    def release(self, grant_id: int, now: float) -> None:
        need, reported, final = self.open.pop(grant_id)
        if not final:
            self.placed.append(
                (
                    now,
                    max(0, need.requests - reported.requests),
                    max(0, need.tokens - reported.tokens),
                )
            )


whole_steps = st.one_of(st.sampled_from([0, 1, 5, 30, 59, 60, 61]), st.integers(0, 70))


@PROPERTY
@given(
    limit=limits,
    steps_=st.lists(
        st.tuples(
            whole_steps,
            st.sampled_from(["grant", "report", "final", "end", "throttle"]),
            st.builds(Need, requests=st.integers(0, 4), tokens=st.integers(0, 60)),
            st.integers(0, 40),  # which open attempt
        ),
        max_size=80,
    ),
)
def test_the_book_admits_exactly_what_the_rule_says(
    limit: tuple[int | None, int | None, int | None],
    steps_: list[tuple[int, str, Need, int]],
) -> None:
    book = BudgetBook()
    book.upsert_budget(BudgetSpec("b", *limit))
    rule = Rule(*limit)
    now = 0.0
    next_id = 0
    for step, kind, need, pick in steps_:
        now += step
        opened = sorted(rule.open)
        if kind == "grant":
            admitted = book.admits({"b": need}, now) is None
            assert admitted == rule.admits(need, now), (now, need)
            if admitted:
                book.debit(next_id, {"b": need}, now)
                rule.debit(next_id, need, now)
                next_id += 1
        elif kind in ("report", "final") and opened:
            grant_id = opened[pick % len(opened)]
            so_far = rule.open[grant_id][1]
            usage = Usage(so_far.requests + need.requests, so_far.tokens + need.tokens)
            book.correct(grant_id, {"b": usage}, now, final=kind == "final")
            rule.correct(grant_id, usage, now, kind == "final")
        elif kind == "end" and opened:
            grant_id = opened[pick % len(opened)]
            book.release(grant_id, now)
            rule.release(grant_id, now)
        elif kind == "throttle":
            book.throttle("b", now + need.tokens)
            rule.throttled = max(rule.throttled, now + need.tokens)
