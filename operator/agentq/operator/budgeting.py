"""Provider budgets in the operator: the budget book (``scheduler.budgets``) kept as the
store says (docs/budgets.md).

- **Specs**: the book's budgets follow the store's AgentBudgets (``sync_specs``).
- **Verdicts** (``verdict``): a task naming a budget that does not exist, or whose
  estimate exceeds a per-minute limit, is never dispatched: it is no member of the
  pending queue (as a task whose AgentQueue does not admit it) and its ``Budgeted``
  condition says why, judged again whenever a budget changes.
- **Grants**: the dispatcher asks ``admits`` for the head of a set whose tasks name
  budgets, ``debit``s at the grant and ``refund``s a grant not sent. Every other end
  of a grant follows the task's record (``sync``, from ``Cores.sync_load``, the one
  place every change of a task passes): a grant whose compare-and-swap did not land
  is refunded once the store shows so (a grant of unknown outcome is kept until
  then); a claim that ended, for whatever reason (completed, failed, reclaimed,
  cancelled, the task deleted), is released -- its concurrency back, its estimate
  placed for the minute after its end.
- **Reports** (``lease_seen``): the usage and throttles an attempt's agent reports
  on its claim's Lease (read by ``agentq.protocol``, as the sidecar writes them: what
  it would not write is ignored) correct its grant and pause its budget, each throttle
  once per id for as long as the attempt holds its grant; ``accounted`` is what
  the status patch ending the attempt records (``status.history[].usage``).
- **Restore** (``restore``): a new leader's book, before its first grant, from what
  the task statuses show (running attempts and ``status.history``), the finished
  tasks seen in the last minute (they have no record in the store), the budgets'
  persisted windows and throttles. Never below the truth: a restart mid-minute grants
  no more than the limit in that minute.

Tasks without ``spec.budgets`` never reach the book.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Hashable
from dataclasses import dataclass, field

from agentq import protocol
from agentq.clock import Clock
from agentq.models import AttemptOutcome
from agentq.operator import metrics
from agentq.operator.records import TaskRecord
from agentq.operator.store import Store
from agentq.scheduler.budgets import (
    BUDGET_NOT_FOUND,
    ESTIMATE_EXCEEDS_LIMIT,
    HOLD_SECONDS,
    RESTORE_OVERLAP,
    BudgetBook,
    BudgetSpec,
    Debit,
    Need,
    OpenGrant,
    Placement,
    Usage,
    Wait,
    Window,
)
from agentq.views import Key, LeaseView, TaskView

__all__ = ["WAIT_REPORT_SECONDS", "Budgets", "needs_of", "signature", "verdict_of"]

log = logging.getLogger("agentq.controller")

#: A task refused by a budget at the head of its set for this long gets the condition
#: ``Budgeted: False`` (not on every refusal: a saturated budget refuses many times a
#: second). ``BUDGET_WAIT_REPORT_SECONDS`` in docs/budgets.md.
WAIT_REPORT_SECONDS = 5.0

_REASONS = {
    "RequestsPerMinute": "no room for its requests in the last minute",
    "TokensPerMinute": "no room for its tokens in the last minute",
    "MaxConcurrent": "every concurrent claim is held",
    "Throttled": "paused after a provider's 429",
}


def needs_of(view: TaskView) -> dict[str, Need]:
    """The task's estimate per budget it names (empty: it names none)."""
    return {b.name: Need(requests=b.requests, tokens=b.tokens) for b in view.spec.budgets or ()}


def signature(view: TaskView) -> frozenset[str]:
    """The budgets a task names: part of its pending set's key."""
    return frozenset(b.name for b in view.spec.budgets or ())


def verdict_of(view: TaskView, store: Store) -> tuple[str, str] | None:
    """What no time can cure in a task's budgets (None: nothing): a budget that does not
    exist (or whose spec is invalid), an estimate above a per-minute limit."""
    for entry in sorted(view.spec.budgets or (), key=lambda b: b.name):
        known = store.budgets.get(entry.name)
        spec = known.spec if known is not None else None
        if spec is None:
            return BUDGET_NOT_FOUND, f"AgentBudget {entry.name} does not exist"
        rpm, tpm = spec.requests_per_minute, spec.tokens_per_minute
        if rpm is not None and entry.requests > rpm:
            return (
                ESTIMATE_EXCEEDS_LIMIT,
                f"its estimate of {entry.requests} requests exceeds AgentBudget "
                f"{entry.name}'s requestsPerMinute {rpm}: it could never be granted",
            )
        if tpm is not None and entry.tokens > tpm:
            return (
                ESTIMATE_EXCEEDS_LIMIT,
                f"its estimate of {entry.tokens} tokens exceeds AgentBudget "
                f"{entry.name}'s tokensPerMinute {tpm}: it could never be granted",
            )
    return None


def wait_message(wait: Wait, now: float) -> str:
    """The message of a ``Budgeted: False`` condition for a wait (stable while it lasts:
    the condition is not written again for a new estimate of when)."""
    why = _REASONS.get(wait.reason, wait.reason)
    return f"waiting for AgentBudget {wait.budget}: {why}"


@dataclass
class _Open:
    """A grant the book holds for a task: its id, its fencing token, the debit (None:
    restored), whether the store has shown it landed, and the ids of the throttle
    reports applied from its Lease (each once, for as long as the attempt lasts)."""

    grant_id: Hashable
    token: int
    debit: Debit | None
    landed: bool
    throttles: set[str] = field(default_factory=set)


class Budgets:
    """The budget book, kept as the store says (see the module docstring)."""

    def __init__(self, store: Store, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self.book = BudgetBook()
        self.open: dict[Key, _Open] = {}
        self.restored = False
        # Finished tasks (no record in the store) whose attempts ended in the last
        # minute: key -> (uid, placements), for a new leader's restore.
        self.finished: dict[Key, tuple[str, list[Placement]]] = {}
        self._forgot = clock.monotonic()  # when ``finished`` was last pruned

    # -- the budgets' specs ---------------------------------------------------------------

    def sync_specs(self) -> None:
        """The book's budgets as the store's AgentBudgets (an unknown one's books are
        kept while anything is in them: a deletion is no reset)."""
        known = set()
        for name, view in self.store.budgets.items():
            spec = view.spec
            if spec is None:
                continue
            known.add(name)
            self.book.upsert_budget(
                BudgetSpec(
                    name,
                    requests_per_minute=spec.requests_per_minute,
                    tokens_per_minute=spec.tokens_per_minute,
                    max_concurrent=spec.max_concurrent,
                )
            )
        for name in self.book.budgets():
            if name not in known:
                self.book.remove_budget(name)
        self.book.prune(self.clock.monotonic())

    # -- grants ---------------------------------------------------------------------------

    def admits(self, view: TaskView, now: float) -> Wait | None:
        return self.book.admits(needs_of(view), now)

    def debit(self, view: TaskView, token: int, now: float) -> None:
        """The grant of ``view`` with ``token`` (admitted): debited before it is sent."""
        key = view.key
        stale = self.open.pop(key, None)
        if stale is not None:  # (never: a claim's end is seen before the next grant)
            self.book.release(stale.grant_id, now)
        grant_id = (view.namespace, view.name, token)
        debit = self.book.debit(grant_id, needs_of(view), now)
        self.open[key] = _Open(grant_id, token, debit, landed=False)
        for name, _ in debit.needs:
            metrics.BUDGET_GRANTS.labels(name).inc()

    def sync(self, key: Key, record: TaskRecord | None) -> None:
        """The book's grant of ``key`` as its record says: kept while the grant is in
        flight, in doubt or its claim held; refunded if it never landed; released when
        its claim ended (any way, the task deleted included)."""
        held = self.open.get(key)
        if held is None:
            return
        now = self.clock.monotonic()
        if record is not None:
            if record.granting is not None or record.doubt is not None:
                return  # in flight, or of unknown outcome: held until the store says
            status = record.view.status
            token = status.fencing_token or 0
            if held.token == 0 and record.view.active:
                held.token = token  # a grant in doubt when we took the lead: it landed
            if token == held.token and record.view.active:
                held.landed = True
                return
            if token < held.token and not held.landed and held.debit is not None:
                del self.open[key]
                self.book.refund(held.debit)  # the compare-and-swap did not land
                return
        # The claim ended (or the task went while its grant may have landed).
        del self.open[key]
        self.book.release(held.grant_id, now)

    def accounted(self, task: TaskView, token: int) -> list[dict[str, int | str]] | None:
        """What the attempt of ``task`` with ``token`` is accounted on each budget, while
        the book holds its grant (``status.history[].usage``); None otherwise."""
        held = self.open.get(task.key)
        if held is None or held.token != token:
            return None
        usage = self.book.accounted(held.grant_id)
        return [
            {"name": name, "requests": u.requests, "tokens": u.tokens}
            for name, u in sorted(usage.items())
        ] or None

    # -- what agents report (their claim's Lease) -------------------------------------------

    def lease_seen(self, task: TaskView, lease: LeaseView | None) -> None:
        """The claim Lease of ``task`` changed: its attempt's usage corrects the grant
        (cumulative; the report's usage is its last word), a throttle report pauses its
        budget for everyone (once per report id). Only for the attempt the book holds:
        the Lease's token is the grant's."""
        if lease is None or not task.spec.budgets:
            return
        held = self.open.get(task.key)
        if held is None or lease.token is None or lease.token != held.token:
            return
        now = self.clock.monotonic()
        needs = needs_of(task)
        before = self.book.accounted(held.grant_id)
        usage = _lease_usage(lease)
        if usage:
            self.book.correct(held.grant_id, usage, now)
        final = _final_usage(lease, held.token)
        if final:
            self.book.correct(held.grant_id, final, now, final=True)
        if usage or final:
            _count_corrections(before, self.book.accounted(held.grant_id))
        throttle = _lease_throttle(lease)
        if throttle is None or throttle.budget not in needs or throttle.id in held.throttles:
            return  # none, not its task's, or applied already (a renewal since)
        held.throttles.add(throttle.id)
        self.book.throttle(throttle.budget, now + float(throttle.retry_after_seconds))
        metrics.BUDGET_THROTTLES.labels(throttle.budget).inc()

    # -- a new leader ---------------------------------------------------------------------

    def clear(self) -> None:
        """A new leader's book is restored afresh (``restore``) before its first grant."""
        self.book = BudgetBook()
        self.open.clear()
        self.restored = False

    def saw_finished(self, key: Key, view: TaskView | None) -> None:
        """A finished task seen (None: gone, or not finished): its attempts' ends of the
        last minute kept for a restore (a finished task has no record in the store)."""
        if view is None or not view.spec.budgets:
            return
        now = self.clock.monotonic()
        if now - self._forgot > HOLD_SECONDS:
            self._forgot = now
            self.forget_old()
        placements = _ended(view, self.clock.now(), now)
        if placements:
            self.finished[key] = (view.uid, placements)
        else:
            self.finished.pop(key, None)

    def forget_old(self) -> None:
        """Drop the finished tasks' ends older than a minute."""
        horizon = self.clock.monotonic() - HOLD_SECONDS - RESTORE_OVERLAP
        for key in [k for k, (_, ps) in self.finished.items() if max(p.at for p in ps) < horizon]:
            del self.finished[key]

    def restore(self) -> None:
        """The book from what the API server shows (docs/budgets.md, "Surviving a restart
        and a failover"); once, before the new leader's first grant."""
        self.restored = True
        self.sync_specs()
        now = self.clock.monotonic()
        wall = self.clock.now()
        grants: list[OpenGrant] = []
        ended: list[Placement] = []
        seen: set[Key] = set()
        for key, record in self.store.tasks.items():
            view = record.view
            if not view.spec.budgets:
                continue
            seen.add(key)
            ended.extend(_ended(view, wall, now))
            token = view.status.fencing_token or 0
            if record.doubt is not None and not view.active:
                # A grant of ours of unknown outcome when we (last) led: held until the
                # store says whether it landed (its token unknown here: 0).
                grants.append(OpenGrant((view.namespace, view.name, 0), needs_of(view), now))
                self.open[key] = _Open((view.namespace, view.name, 0), 0, None, landed=False)
            elif view.active:
                assigned = view.status.assigned_at
                at = now if assigned is None else _mono(assigned, wall, now)
                grant_id = (view.namespace, view.name, token)
                lease = self.store.lease_of(view)
                usage: dict[str, Usage] = {}
                applied: set[str] = set()
                if lease is not None and lease.view.token == token:
                    usage = _lease_usage(lease.view) or {}
                    said = _lease_throttle(lease.view)
                    if said is not None:
                        # Applied by the last leader (its end is in throttledUntil): not
                        # again, at this Lease's next change.
                        applied.add(said.id)
                needs = needs_of(view)
                usage = {name: u for name, u in usage.items() if name in needs}
                grants.append(OpenGrant(grant_id, needs, min(at, now), usage))
                self.open[key] = _Open(grant_id, token, None, landed=True, throttles=applied)
        self.forget_old()
        for key, (_, placements) in self.finished.items():
            if key not in seen:
                ended.extend(placements)
        windows: dict[str, Window] = {}
        throttles: dict[str, float] = {}
        for name, budget in self.store.budgets.items():
            status = budget.status
            if status.throttled_until is not None:
                until = _mono(status.throttled_until, wall, now)
                if until > now:
                    throttles[name] = until
            window = status.window
            if window is not None:
                windows[name] = Window(
                    as_of=_mono(window.as_of, wall, now),
                    bucket_seconds=window.bucket_seconds,
                    buckets=tuple(
                        (
                            _mono(b.start, wall, now),
                            Usage(requests=b.requests or 0, tokens=b.tokens or 0),
                        )
                        for b in window.buckets or ()
                    ),
                )
        try:
            self.book.restore(now, grants=grants, ended=ended, windows=windows, throttles=throttles)
        except ValueError:
            # (never: every amount is checked by the models) The claims held, at least:
            # a book that cannot be restored must not stop every grant.
            log.exception("could not restore the budgets' last minute; from the claims only")
            self.book = BudgetBook()
            self.sync_specs()
            self.book.restore(now, grants=grants)


def _count_corrections(before: dict[str, Usage], after: dict[str, Usage]) -> None:
    """``agentq_budget_corrections_total``: what reports moved an attempt's accounted
    amount (above its estimate: extra; a final report below it: refund)."""
    for name, now in after.items():
        was = before.get(name, now)
        for resource, moved in (
            ("requests", now.requests - was.requests),
            ("tokens", now.tokens - was.tokens),
        ):
            if moved:
                direction = "extra" if moved > 0 else "refund"
                metrics.BUDGET_CORRECTIONS.labels(name, resource, direction).inc(abs(moved))


def _lease_usage(lease: LeaseView) -> dict[str, Usage] | None:
    """The attempt's cumulative usage on its claim's Lease (``agentq.dev/usage``), read
    by ``agentq.protocol``: None when absent or not what a sidecar writes."""
    if lease.usage is None:
        return None
    said = protocol.lease_usage({protocol.ANNOTATION_USAGE: lease.usage})
    return None if said is None else _book_usage(said)


def _lease_throttle(lease: LeaseView) -> protocol.Throttle | None:
    """The last throttle its agent reported (``agentq.dev/throttled``), read by
    ``agentq.protocol``: None when absent or not what a sidecar writes."""
    if lease.throttled is None:
        return None
    return protocol.lease_throttle({protocol.ANNOTATION_THROTTLED: lease.throttled})


def _final_usage(lease: LeaseView, token: int) -> dict[str, Usage] | None:
    """The usage in the attempt's report (``agentq.dev/report``) when the report is the
    attempt's (``token``) and readable (``Report.decode``, as its outcome is read)."""
    if lease.report is None:
        return None
    try:
        report = protocol.Report.decode(lease.report)
    except protocol.ProtocolError:
        return None  # the attempt fails InvalidReport: its estimate stays spent
    if report.token != token or not report.usage:
        return None
    return _book_usage(report.usage)


def _book_usage(usage: dict[str, protocol.Usage]) -> dict[str, Usage]:
    return {name: Usage(requests=u.requests, tokens=u.tokens) for name, u in usage.items()}


def _mono(at: datetime.datetime, wall: datetime.datetime, now: float) -> float:
    """A wall-clock time on our monotonic timeline."""
    return now + (at - wall).total_seconds()


def _ended(view: TaskView, wall: datetime.datetime, now: float) -> list[Placement]:
    """The attempts of ``view`` that ended in the last minute (and a margin), each placed
    at its end: what its history entry says it was accounted, else its estimate."""
    needs = needs_of(view)
    out: list[Placement] = []
    horizon = now - HOLD_SECONDS - RESTORE_OVERLAP
    for entry in view.status.history or ():
        if entry.outcome is AttemptOutcome.REQUEUED or entry.token is None:
            continue  # not the end of an attempt
        at = min(now, _mono(entry.time, wall, now))
        if at < horizon:
            continue
        usage = {u.name: u for u in entry.usage or ()}
        for name, need in needs.items():
            reported = usage.get(name)
            if reported is not None:
                amount = Usage(requests=reported.requests or 0, tokens=reported.tokens or 0)
            else:
                amount = Usage(requests=need.requests, tokens=need.tokens)
            out.append(Placement(name, at, amount))
    return out
