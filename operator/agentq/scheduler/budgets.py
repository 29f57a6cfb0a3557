"""Provider budgets: whether a grant fits every budget it names, and each budget's books.

The rule and its reasons are ``docs/budgets.md``; in short, per budget:

- **occupancy** = the usage *placed* in the last minute + the *reservations* of the
  open grants (their estimates less what they reported). A grant needs
  ``occupancy + estimate <= limit`` for requests and for tokens, ``inUse + 1 <=
  maxConcurrent``, no throttle in force, and the **pace** come: per dimension a
  theoretical arrival time ``TAT <= now``, advanced by ``amount * 60 / limit``
  (GCRA without tolerance: an even spread over the minute).
- a placement at ``t`` goes into the 1-second bucket ``floor(t)`` and counts while
  ``now < floor(t) + HOLD_SECONDS``: at least 60 s, at most 61 s.
- ``debit`` reserves the estimate; ``correct`` places what an attempt reports at
  the time it reports it (cumulative reports: only the increase counts); a final
  report ends the reservation (what was not spent comes back); ``release`` ends a
  claim -- whatever was reserved and not reported is placed then (it stays spent
  for a minute); ``refund`` undoes a debit whose commit failed, exactly.
- ``restore``: a new leader's books, from what the task statuses and the budgets'
  persisted windows show, never below the truth.

Pure: no I/O, no clock (every call is given ``now``, seconds on one timeline of the
caller's choosing, which never goes back: an earlier ``now`` is read as the latest
seen), no randomness.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "BUCKET_SECONDS",
    "BUDGET_NOT_FOUND",
    "ESTIMATE_EXCEEDS_LIMIT",
    "HOLD_SECONDS",
    "MAX_CONCURRENT",
    "REQUESTS_PER_MINUTE",
    "RESTORE_OVERLAP",
    "THROTTLED",
    "TOKENS_PER_MINUTE",
    "WINDOW_SECONDS",
    "BudgetBook",
    "BudgetSpec",
    "BudgetState",
    "Debit",
    "Need",
    "NotAdmitted",
    "OpenGrant",
    "Placement",
    "Usage",
    "Wait",
    "Window",
]

#: The sliding window of the per-minute limits.
WINDOW_SECONDS = 60
#: A placement in the bucket of second ``s`` counts while ``now < s + HOLD_SECONDS``:
#: a whole window after any moment of its second.
HOLD_SECONDS = WINDOW_SECONDS + 1
#: The width of the buckets of a persisted window (``AgentBudget.status.window``).
BUCKET_SECONDS = 5
#: An ended attempt whose end is this close before a persisted window's ``asOf`` (or
#: after it) is restored from its task as well: the two stamps come from two
#: replicas' wall clocks.
RESTORE_OVERLAP = 10.0

# Why a grant waits (the reason of the task's Budgeted condition).
BUDGET_NOT_FOUND = "BudgetNotFound"
ESTIMATE_EXCEEDS_LIMIT = "EstimateExceedsLimit"
THROTTLED = "Throttled"
MAX_CONCURRENT = "MaxConcurrent"
REQUESTS_PER_MINUTE = "RequestsPerMinute"
TOKENS_PER_MINUTE = "TokensPerMinute"
_PERMANENT = frozenset({BUDGET_NOT_FOUND, ESTIMATE_EXCEEDS_LIMIT})


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be an integer >= 0, got {value!r}")
    return value


def _limit(value: object, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be an integer > 0 or None, got {value!r}")
    return value


@dataclass(frozen=True)
class BudgetSpec:
    """What the core knows of one AgentBudget: its name and limits (None: no limit)."""

    name: str
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent: int | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a budget needs a name")
        _limit(self.requests_per_minute, f"budget {self.name!r}: requests_per_minute")
        _limit(self.tokens_per_minute, f"budget {self.name!r}: tokens_per_minute")
        _limit(self.max_concurrent, f"budget {self.name!r}: max_concurrent")


@dataclass(frozen=True)
class Need:
    """An attempt's estimate on one budget (``AgentTask.spec.budgets[]``)."""

    requests: int = 1
    tokens: int = 0

    def __post_init__(self) -> None:
        _count(self.requests, "requests")
        _count(self.tokens, "tokens")


@dataclass(frozen=True)
class Usage:
    """Requests and tokens spent (reported, cumulative per attempt) or placed."""

    requests: int = 0
    tokens: int = 0

    def __post_init__(self) -> None:
        _count(self.requests, "requests")
        _count(self.tokens, "tokens")


@dataclass(frozen=True)
class Wait:
    """Why a grant may not be made now: which budget, the reason (a condition reason),
    and when room may come back by the passing of time alone (None: only an event --
    a claim ending, a report, a budget changing -- can free it)."""

    budget: str
    reason: str
    until: float | None = None

    @property
    def permanent(self) -> bool:
        """No time cures it (an unknown budget, an estimate above a limit)."""
        return self.reason in _PERMANENT


class NotAdmitted(ValueError):
    """``debit`` of a grant the budgets do not admit now (``wait`` says why)."""

    def __init__(self, wait: Wait) -> None:
        super().__init__(f"budget {wait.budget!r} does not admit the grant: {wait.reason}")
        self.wait = wait


@dataclass(frozen=True)
class Debit:
    """One grant debited (for ``refund``): its id, estimates, time and pace advances."""

    grant_id: Hashable
    needs: tuple[tuple[str, Need], ...]
    at: float
    # (budget, requests advance, tokens advance) of the pace, in seconds.
    paced: tuple[tuple[str, float, float], ...]


@dataclass(frozen=True)
class BudgetState:
    """A snapshot of one budget's books at ``now`` (for status, metrics and tests)."""

    name: str
    spec: BudgetSpec | None  # None: the budget is unknown (removed), its books kept
    used: Usage  # placed in the last minute
    reserved: Usage  # open grants' estimates less what they reported
    in_use: int  # open grants naming it
    throttled_until: float | None
    # When the pace lets the next grant go (``now`` when it already does).
    requests_ready_at: float
    tokens_ready_at: float

    @property
    def available_requests(self) -> int | None:
        limit = self.spec.requests_per_minute if self.spec else None
        if limit is None:
            return None
        return max(0, limit - self.used.requests - self.reserved.requests)

    @property
    def available_tokens(self) -> int | None:
        limit = self.spec.tokens_per_minute if self.spec else None
        if limit is None:
            return None
        return max(0, limit - self.used.tokens - self.reserved.tokens)

    @property
    def available_concurrency(self) -> int | None:
        limit = self.spec.max_concurrent if self.spec else None
        return None if limit is None else max(0, limit - self.in_use)


@dataclass(frozen=True)
class OpenGrant:
    """A claim a new leader finds held (a task Assigned or Running): its grant id, its
    estimates, when it was granted, and what its attempt reported so far (the Lease)."""

    grant_id: Hashable
    needs: Mapping[str, Need]
    granted_at: float
    usage: Mapping[str, Usage] = field(default_factory=dict)


@dataclass(frozen=True)
class Placement:
    """Usage placed on a budget at a time: an ended attempt's accounted amount at its
    end (its ``status.history`` entry)."""

    budget: str
    at: float
    usage: Usage


@dataclass(frozen=True)
class Window:
    """A budget's placements of the last minute in buckets (``AgentBudget.status.window``):
    each ``(start, usage)`` holds what was placed in ``[start, start + bucket_seconds)``."""

    as_of: float
    bucket_seconds: int
    buckets: tuple[tuple[float, Usage], ...] = ()


class _Books:
    """One budget's state."""

    __slots__ = (
        "buckets",
        "expiry",
        "in_use",
        "name",
        "reserved_requests",
        "reserved_tokens",
        "spec",
        "tat_requests",
        "tat_tokens",
        "throttled_until",
        "used_requests",
        "used_tokens",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.spec: BudgetSpec | None = None
        self.buckets: dict[int, list[int]] = {}  # second -> [requests, tokens] placed
        self.expiry: list[int] = []  # the buckets' seconds, a heap
        self.used_requests = 0  # sums of the live buckets
        self.used_tokens = 0
        self.reserved_requests = 0
        self.reserved_tokens = 0
        self.in_use = 0
        self.tat_requests = -math.inf
        self.tat_tokens = -math.inf
        self.throttled_until: float | None = None

    def expire(self, now: float) -> None:
        while self.expiry and self.expiry[0] + HOLD_SECONDS <= now:
            second = heapq.heappop(self.expiry)
            requests, tokens = self.buckets.pop(second)
            self.used_requests -= requests
            self.used_tokens -= tokens

    def place(self, at: float, requests: int, tokens: int, now: float) -> None:
        if not (requests or tokens):
            return
        second = math.floor(at)
        if second + HOLD_SECONDS <= now:
            return  # already out of the window
        bucket = self.buckets.get(second)
        if bucket is None:
            bucket = self.buckets[second] = [0, 0]
            heapq.heappush(self.expiry, second)
        bucket[0] += requests
        bucket[1] += tokens
        self.used_requests += requests
        self.used_tokens += tokens

    def room_at(self, excess: int, index: int) -> float | None:
        """When enough placements leave the window to free ``excess`` (requests: index 0,
        tokens: 1)."""
        freed = 0
        for second in sorted(self.buckets):
            freed += self.buckets[second][index]
            if freed >= excess:
                return float(second + HOLD_SECONDS)
        return None

    def idle(self, now: float) -> bool:
        """Nothing left to remember: no open grant, no placement, no throttle in force."""
        self.expire(now)
        return (
            self.in_use == 0
            and not self.buckets
            and self.reserved_requests == 0
            and self.reserved_tokens == 0
            and (self.throttled_until is None or self.throttled_until <= now)
        )


def _pace(limit: int | None, amount: int) -> float:
    """Seconds the pace advances for ``amount`` under ``limit`` a minute."""
    if limit is None or amount <= 0:
        return 0.0
    return amount * WINDOW_SECONDS / limit


class _Grant:
    """One open grant: its estimates, and per budget what its attempt reported."""

    __slots__ = ("corrected", "debit", "final", "needs", "paces", "reported")

    def __init__(self, needs: dict[str, Need], debit: Debit | None) -> None:
        self.needs = needs
        self.debit = debit  # None: restored
        self.reported: dict[str, Usage] = {name: Usage() for name in needs}
        self.final: set[str] = set()  # budgets whose final report came
        self.corrected = False
        # Per budget, the paces before and after the debit (requests, tokens): a refund
        # with nothing paced since puts the old values back, bit for bit.
        self.paces: dict[str, tuple[float, float, float, float]] = {}


class BudgetBook:
    """Every AgentBudget's books, and the open grants that name them (module docstring)."""

    def __init__(self) -> None:
        self._books: dict[str, _Books] = {}
        self._grants: dict[Hashable, _Grant] = {}
        self._now = -math.inf

    # -- time and budgets ------------------------------------------------------------

    def _at(self, now: float) -> float:
        if math.isnan(now):
            raise ValueError("now must be a number")
        if now > self._now:
            self._now = now
        return self._now

    def _get(self, name: str) -> _Books:
        books = self._books.get(name)
        if books is None:
            books = self._books[name] = _Books(name)
        return books

    def upsert_budget(self, spec: BudgetSpec) -> None:
        """Add a budget or apply a changed spec; its books are kept (a lower limit holds
        grants back until the window is under it)."""
        self._get(spec.name).spec = spec

    def remove_budget(self, name: str) -> None:
        """The budget is unknown from now on (its tasks wait ``BudgetNotFound``); its books
        are kept while anything is in them, so deleting and re-creating it is no reset."""
        books = self._books.get(name)
        if books is None:
            return
        books.spec = None
        self._forget_if_idle(books)

    def _forget_if_idle(self, books: _Books) -> None:
        if books.spec is None and books.idle(self._now):
            del self._books[books.name]

    def prune(self, now: float) -> None:
        """Forget the books of removed budgets that hold nothing any more."""
        self._at(now)
        for books in list(self._books.values()):
            self._forget_if_idle(books)

    def budgets(self) -> list[str]:
        """Every budget with books (known, or removed and still holding something)."""
        return sorted(self._books)

    # -- admission -------------------------------------------------------------------

    def admits(self, needs: Mapping[str, Need], now: float) -> Wait | None:
        """None if a grant with these estimates may be made now, else the binding
        ``Wait``: a permanent one first, then one only an event can end, then the
        one that ends last."""
        if not needs:
            return None
        now = self._at(now)
        best: tuple[tuple[int, float, str], Wait] | None = None
        for name in sorted(needs):
            wait = self._refusal(name, needs[name], now)
            if wait is None:
                continue
            if wait.permanent:
                rank: tuple[int, float, str] = (0, 0.0, name)
            elif wait.until is None:
                rank = (1, 0.0, name)
            else:
                rank = (2, -wait.until, name)
            if best is None or rank < best[0]:
                best = (rank, wait)
        return None if best is None else best[1]

    def _refusal(self, name: str, need: Need, now: float) -> Wait | None:
        books = self._books.get(name)
        spec = books.spec if books is not None else None
        if books is None or spec is None:
            return Wait(name, BUDGET_NOT_FOUND)
        rpm, tpm = spec.requests_per_minute, spec.tokens_per_minute
        if (rpm is not None and need.requests > rpm) or (tpm is not None and need.tokens > tpm):
            return Wait(name, ESTIMATE_EXCEEDS_LIMIT)
        books.expire(now)
        waits: list[Wait] = []
        if books.throttled_until is not None and books.throttled_until > now:
            waits.append(Wait(name, THROTTLED, books.throttled_until))
        if spec.max_concurrent is not None and books.in_use + 1 > spec.max_concurrent:
            waits.append(Wait(name, MAX_CONCURRENT))
        for limit, amount, used, reserved, tat, index, reason in (
            (
                rpm,
                need.requests,
                books.used_requests,
                books.reserved_requests,
                books.tat_requests,
                0,
                REQUESTS_PER_MINUTE,
            ),
            (
                tpm,
                need.tokens,
                books.used_tokens,
                books.reserved_tokens,
                books.tat_tokens,
                1,
                TOKENS_PER_MINUTE,
            ),
        ):
            if limit is None or amount <= 0:
                continue
            paced = tat if tat > now else None
            excess = used + reserved + amount - limit
            if excess > 0:
                # Placements leaving the window free at most ``used``: beyond that only an
                # event (a report, a claim's end) can make room.
                room = books.room_at(excess, index) if reserved + amount <= limit else None
                until = None if room is None else max(room, paced or room)
                waits.append(Wait(name, reason, until))
            elif paced is not None:
                waits.append(Wait(name, reason, paced))
        if not waits:
            return None
        # The binding one: an event-only wait, else the latest.
        return max(waits, key=lambda w: math.inf if w.until is None else w.until)

    # -- grants ----------------------------------------------------------------------

    def debit(self, grant_id: Hashable, needs: Mapping[str, Need], now: float) -> Debit:
        """The grant is made: reserve each estimate, take a concurrency claim on each
        budget, advance the paces. Raises ``NotAdmitted`` if ``admits`` would refuse it
        and ``ValueError`` for a grant id already open."""
        if grant_id in self._grants:
            raise ValueError(f"grant {grant_id!r} is already open")
        now = self._at(now)
        wait = self.admits(needs, now)
        if wait is not None:
            raise NotAdmitted(wait)
        paced: list[tuple[str, float, float]] = []
        paces: dict[str, tuple[float, float, float, float]] = {}
        for name in sorted(needs):
            need = needs[name]
            books = self._books[name]
            spec = books.spec
            assert spec is not None  # admitted
            books.reserved_requests += need.requests
            books.reserved_tokens += need.tokens
            books.in_use += 1
            by_requests = _pace(spec.requests_per_minute, need.requests)
            by_tokens = _pace(spec.tokens_per_minute, need.tokens)
            before = (books.tat_requests, books.tat_tokens)
            if by_requests:
                books.tat_requests = max(books.tat_requests, now) + by_requests
            if by_tokens:
                books.tat_tokens = max(books.tat_tokens, now) + by_tokens
            paced.append((name, by_requests, by_tokens))
            paces[name] = (*before, books.tat_requests, books.tat_tokens)
        debit = Debit(
            grant_id=grant_id,
            needs=tuple(sorted(needs.items())),
            at=now,
            paced=tuple(paced),
        )
        grant = self._grants[grant_id] = _Grant(dict(needs), debit)
        grant.paces = paces
        return debit

    def refund(self, debit: Debit) -> bool:
        """The grant's commit failed: undo ``debit`` exactly (reservations, claims, the
        paces' advances). False if the grant is no longer open; ``ValueError`` if its
        attempt already reported (a grant that landed is released, not refunded)."""
        grant = self._grants.get(debit.grant_id)
        if grant is None:
            return False
        if grant.debit is not debit:
            raise ValueError(f"grant {debit.grant_id!r} is open under another debit")
        if grant.corrected:
            raise ValueError(f"grant {debit.grant_id!r} has reports: release it instead")
        del self._grants[debit.grant_id]
        for name, by_requests, by_tokens in debit.paced:
            books = self._books[name]
            need = grant.needs[name]
            books.reserved_requests -= need.requests
            books.reserved_tokens -= need.tokens
            books.in_use -= 1
            requests_before, tokens_before, requests_after, tokens_after = grant.paces[name]
            # Nothing paced since: the old pace exactly; else the advance taken back.
            if books.tat_requests == requests_after:
                books.tat_requests = requests_before
            else:
                books.tat_requests -= by_requests
            if books.tat_tokens == tokens_after:
                books.tat_tokens = tokens_before
            else:
                books.tat_tokens -= by_tokens
            self._forget_if_idle(books)
        return True

    def correct(
        self,
        grant_id: Hashable,
        usage: Mapping[str, Usage],
        now: float,
        *,
        final: bool = False,
    ) -> None:
        """What the grant's attempt reports it spent so far on each budget (cumulative:
        only an increase counts). The increase is placed now; the reservation shrinks to
        what the estimate has left; usage above the estimate advances the pace. A
        ``final`` report ends the reservation of each budget it names (what was not
        spent comes back, on the pace too). Budgets the grant does not name, and
        reports about a grant no longer open, are ignored."""
        grant = self._grants.get(grant_id)
        if grant is None:
            return
        now = self._at(now)
        for name, reported in usage.items():
            need = grant.needs.get(name)
            if need is None or name in grant.final:
                continue
            books = self._books[name]
            books.expire(now)
            before = grant.reported[name]
            after = Usage(
                max(before.requests, reported.requests), max(before.tokens, reported.tokens)
            )
            books.place(now, after.requests - before.requests, after.tokens - before.tokens, now)
            books.reserved_requests -= max(0, need.requests - before.requests)
            books.reserved_tokens -= max(0, need.tokens - before.tokens)
            if not final:
                books.reserved_requests += max(0, need.requests - after.requests)
                books.reserved_tokens += max(0, need.tokens - after.tokens)
            spec = books.spec
            rpm = spec.requests_per_minute if spec else None
            tpm = spec.tokens_per_minute if spec else None
            extra_requests = after.requests - max(need.requests, before.requests)
            extra_tokens = after.tokens - max(need.tokens, before.tokens)
            if extra_requests > 0 and rpm is not None:
                books.tat_requests = max(books.tat_requests, now) + _pace(rpm, extra_requests)
            if extra_tokens > 0 and tpm is not None:
                books.tat_tokens = max(books.tat_tokens, now) + _pace(tpm, extra_tokens)
            if final:
                books.tat_requests -= _pace(rpm, need.requests - after.requests)
                books.tat_tokens -= _pace(tpm, need.tokens - after.tokens)
                grant.final.add(name)
            grant.reported[name] = after
            grant.corrected = True

    def release(self, grant_id: Hashable, now: float) -> dict[str, Usage]:
        """The grant's claim ended, for any reason: its concurrency comes back, and on each
        budget without a final report what is still reserved is placed now (spent for a
        minute: nothing says it was not). Returns what the attempt was accounted per budget
        (``status.history[].usage``); empty for a grant no longer open."""
        grant = self._grants.pop(grant_id, None)
        if grant is None:
            return {}
        now = self._at(now)
        accounted: dict[str, Usage] = {}
        for name, need in grant.needs.items():
            books = self._books[name]
            books.expire(now)
            books.in_use -= 1
            reported = grant.reported[name]
            if name in grant.final:
                accounted[name] = reported
            else:
                left_requests = max(0, need.requests - reported.requests)
                left_tokens = max(0, need.tokens - reported.tokens)
                books.reserved_requests -= left_requests
                books.reserved_tokens -= left_tokens
                books.place(now, left_requests, left_tokens, now)
                accounted[name] = Usage(
                    max(need.requests, reported.requests), max(need.tokens, reported.tokens)
                )
            self._forget_if_idle(books)
        return accounted

    def throttle(self, name: str, until: float) -> bool:
        """A provider answered 429: no grant on the budget before ``until`` (a later pause
        extends it, an earlier one changes nothing). False for a budget without books."""
        books = self._books.get(name)
        if books is None or math.isnan(until):
            return False
        if books.throttled_until is None or until > books.throttled_until:
            books.throttled_until = until
        return True

    # -- reading ---------------------------------------------------------------------

    def holds(self, grant_id: Hashable) -> bool:
        return grant_id in self._grants

    def grants(self) -> list[Hashable]:
        """The open grants' ids (in the order they were opened)."""
        return list(self._grants)

    def accounted(self, grant_id: Hashable) -> dict[str, Usage]:
        """What an open grant's attempt is accounted so far: ``max(estimate, reported)``,
        or the report after a final one."""
        grant = self._grants.get(grant_id)
        if grant is None:
            return {}
        return {
            name: grant.reported[name]
            if name in grant.final
            else Usage(
                max(need.requests, grant.reported[name].requests),
                max(need.tokens, grant.reported[name].tokens),
            )
            for name, need in grant.needs.items()
        }

    def state(self, name: str, now: float) -> BudgetState | None:
        """The budget's books at ``now``; None for a budget without books."""
        books = self._books.get(name)
        if books is None:
            return None
        now = self._at(now)
        books.expire(now)
        return BudgetState(
            name=name,
            spec=books.spec,
            used=Usage(books.used_requests, books.used_tokens),
            reserved=Usage(books.reserved_requests, books.reserved_tokens),
            in_use=books.in_use,
            throttled_until=books.throttled_until,
            requests_ready_at=max(books.tat_requests, now),
            tokens_ready_at=max(books.tat_tokens, now),
        )

    def window(self, name: str, now: float, *, bucket_seconds: int = BUCKET_SECONDS) -> Window:
        """The budget's placements still in the window, in ``bucket_seconds``-wide buckets
        (for ``AgentBudget.status.window``; reservations are not in it: a new leader
        rebuilds them from the open claims)."""
        if isinstance(bucket_seconds, bool) or not 1 <= bucket_seconds <= WINDOW_SECONDS:
            raise ValueError(f"bucket_seconds must be 1 to {WINDOW_SECONDS}")
        now = self._at(now)
        books = self._books.get(name)
        if books is None:
            return Window(as_of=now, bucket_seconds=bucket_seconds)
        books.expire(now)
        grouped: dict[int, list[int]] = {}
        for second, (requests, tokens) in books.buckets.items():
            start = second - second % bucket_seconds
            total = grouped.setdefault(start, [0, 0])
            total[0] += requests
            total[1] += tokens
        return Window(
            as_of=now,
            bucket_seconds=bucket_seconds,
            buckets=tuple(
                (float(start), Usage(requests, tokens))
                for start, (requests, tokens) in sorted(grouped.items())
                if requests or tokens
            ),
        )

    # -- a new leader ----------------------------------------------------------------

    def restore(
        self,
        now: float,
        *,
        grants: Iterable[OpenGrant] = (),
        ended: Iterable[Placement] = (),
        windows: Mapping[str, Window] | None = None,
        throttles: Mapping[str, float] | None = None,
    ) -> None:
        """A new leader's books, from what is persisted (``docs/budgets.md``), into a
        book that holds no grant yet (its budgets' specs may be in already):

        - each persisted window's buckets, each placed at the end of its bucket plus a
          second (a persisted start is whole seconds);
        - each ended attempt's accounted usage at its end, unless the budget's window
          already holds it (it ended more than ``RESTORE_OVERLAP`` before the window's
          ``asOf``, and that stamp is not in our future);
        - each open grant: its claim, its reservation (estimate less reported), and what
          it reported placed now (it may be in the window too: counted twice rather
          than lost);
        - the throttles;
        - the paces, from the latest of the above: no grant sooner after it than its
          amount spaces (a cumulative replay would count the overlaps twice over).

        Every amount is placed no earlier than it was, so no window is below the truth.
        """
        if self._grants:
            raise ValueError("restore into a book that holds grants")
        now = self._at(now)
        windows = dict(windows or {})
        events: dict[str, list[tuple[float, int, int]]] = {}

        def put(name: str, at: float, requests: int, tokens: int) -> None:
            books = self._get(name)
            books.place(at, requests, tokens, now)
            events.setdefault(name, []).append((at, requests, tokens))

        for name, window in windows.items():
            for start, usage in window.buckets:
                at = start + window.bucket_seconds + 1
                put(name, at, usage.requests, usage.tokens)
        for placement in ended:
            persisted = windows.get(placement.budget)
            if (
                persisted is not None
                and persisted.as_of <= now + RESTORE_OVERLAP
                and placement.at < persisted.as_of - RESTORE_OVERLAP
            ):
                continue  # in the persisted window already
            put(placement.budget, placement.at, placement.usage.requests, placement.usage.tokens)
        for open_grant in grants:
            if open_grant.grant_id in self._grants:
                raise ValueError(f"grant {open_grant.grant_id!r} restored twice")
            needs = dict(open_grant.needs)
            grant = _Grant(needs, None)
            for name, need in needs.items():
                books = self._get(name)
                reported = open_grant.usage.get(name, Usage())
                grant.reported[name] = reported
                grant.corrected = grant.corrected or reported != Usage()
                books.in_use += 1
                books.reserved_requests += max(0, need.requests - reported.requests)
                books.reserved_tokens += max(0, need.tokens - reported.tokens)
                books.place(now, reported.requests, reported.tokens, now)
                events.setdefault(name, []).append(
                    (
                        open_grant.granted_at,
                        max(need.requests, reported.requests),
                        max(need.tokens, reported.tokens),
                    )
                )
            self._grants[open_grant.grant_id] = grant
        for name, until in (throttles or {}).items():
            self._get(name)
            self.throttle(name, until)
        for name, happened in events.items():
            books = self._books[name]
            spec = books.spec
            rpm = spec.requests_per_minute if spec else None
            tpm = spec.tokens_per_minute if spec else None
            for at, requests, tokens in happened:
                if requests and rpm is not None:
                    books.tat_requests = max(books.tat_requests, at + _pace(rpm, requests))
                if tokens and tpm is not None:
                    books.tat_tokens = max(books.tat_tokens, at + _pace(tpm, tokens))
