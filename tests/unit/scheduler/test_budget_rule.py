"""The budget core's rule, case by case (docs/budgets.md): admission, the pace, the
sliding minute, corrections, releases, refunds, throttles, restores."""

from __future__ import annotations

import pytest

from agentq.scheduler.budgets import (
    BUDGET_NOT_FOUND,
    ESTIMATE_EXCEEDS_LIMIT,
    HOLD_SECONDS,
    MAX_CONCURRENT,
    REQUESTS_PER_MINUTE,
    THROTTLED,
    TOKENS_PER_MINUTE,
    BudgetBook,
    BudgetSpec,
    Need,
    NotAdmitted,
    OpenGrant,
    Placement,
    Usage,
    Wait,
    Window,
)

pytestmark = pytest.mark.unit


def book_with(*specs: BudgetSpec) -> BudgetBook:
    book = BudgetBook()
    for spec in specs:
        book.upsert_budget(spec)
    return book


def one(name: str = "b", requests: int = 1, tokens: int = 0) -> dict[str, Need]:
    return {name: Need(requests=requests, tokens=tokens)}


def grant_times(book: BudgetBook, needs: dict[str, Need], count: int, step: float = 0.25) -> list:
    """Offer ``count`` grants with ``needs`` as early as the book admits them, trying every
    ``step`` seconds from 0; the times they went."""
    times: list[float] = []
    now = 0.0
    while len(times) < count:
        if book.admits(needs, now) is None:
            book.debit(("t", len(times)), needs, now)
            times.append(now)
        else:
            now += step
        assert now < 10_000
    return times


# -- admission --------------------------------------------------------------------------


def test_a_task_without_budgets_is_always_admitted() -> None:
    assert BudgetBook().admits({}, 0.0) is None


def test_an_unknown_budget_is_a_permanent_wait() -> None:
    book = book_with(BudgetSpec("known", requests_per_minute=10))
    wait = book.admits({"known": Need(), "missing": Need()}, 0.0)
    assert wait == Wait("missing", BUDGET_NOT_FOUND)
    assert wait.permanent
    with pytest.raises(NotAdmitted) as refused:
        book.debit("g", {"missing": Need()}, 0.0)
    assert refused.value.wait.reason == BUDGET_NOT_FOUND
    assert book.state("known", 0.0).in_use == 0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("spec", "need"),
    [
        (BudgetSpec("b", requests_per_minute=5), Need(requests=6)),
        (BudgetSpec("b", tokens_per_minute=1000), Need(requests=1, tokens=1001)),
    ],
    ids=["requests", "tokens"],
)
def test_an_estimate_above_a_per_minute_limit_is_flagged_not_left_waiting(
    spec: BudgetSpec, need: Need
) -> None:
    book = book_with(spec)
    wait = book.admits({"b": need}, 0.0)
    assert wait == Wait("b", ESTIMATE_EXCEEDS_LIMIT)
    assert wait.permanent
    # A higher limit cures it.
    book.upsert_budget(BudgetSpec("b", requests_per_minute=10, tokens_per_minute=2000))
    assert book.admits({"b": need}, 0.0) is None


def test_a_budget_without_limits_admits_everything_but_a_throttle() -> None:
    book = book_with(BudgetSpec("b"))
    for i in range(100):
        book.debit(i, one(tokens=10**9), 0.0)
    assert book.throttle("b", until=10.0)
    assert book.admits(one(), 5.0) == Wait("b", THROTTLED, 10.0)
    assert book.admits(one(), 10.0) is None


def test_the_binding_wait_is_permanent_then_event_bound_then_the_latest() -> None:
    book = book_with(
        BudgetSpec("conc", max_concurrent=1),
        BudgetSpec("slow", requests_per_minute=1),
        BudgetSpec("fast", requests_per_minute=60),
    )
    book.debit("g1", {"conc": Need(), "slow": Need(), "fast": Need()}, 0.0)
    needs = {"conc": Need(), "slow": Need(), "fast": Need()}
    assert book.admits(needs, 0.5) == Wait("conc", MAX_CONCURRENT, None)
    book.release("g1", 0.5)
    # slow: its one request placed at 0.5 holds the minute until 61; fast's pace: 1.
    assert book.admits(needs, 0.5) == Wait("slow", REQUESTS_PER_MINUTE, 61.0)
    assert book.admits({**needs, "gone": Need()}, 0.5) == Wait("gone", BUDGET_NOT_FOUND)


# -- the pace and the sliding minute ----------------------------------------------------


def test_thirty_one_request_tasks_at_sixty_a_minute_go_one_a_second() -> None:
    book = book_with(BudgetSpec("b", requests_per_minute=60))
    times = grant_times(book, one(), 30)
    assert times == [float(i) for i in range(30)]
    assert times[-1] - times[0] >= 29


def test_the_pace_says_when_the_next_grant_may_go() -> None:
    book = book_with(BudgetSpec("b", tokens_per_minute=6000))
    book.debit("g1", one(tokens=1000), 3.0)
    assert book.admits(one(tokens=1000), 3.0) == Wait("b", TOKENS_PER_MINUTE, 13.0)
    assert book.admits(one(tokens=1000), 13.0) is None
    # An idle budget banks nothing: after an hour, one grant, then the pace again.
    book.debit("g2", one(tokens=1000), 3600.0)
    assert book.admits(one(tokens=1000), 3600.0) == Wait("b", TOKENS_PER_MINUTE, 3610.0)


def test_no_minute_holds_more_than_the_limit_and_the_next_waits_for_the_first_to_leave() -> None:
    # One request a second fills the minute at 60; the grants' attempts end at once and
    # report nothing, so every estimate stays placed for its minute.
    book = book_with(BudgetSpec("b", requests_per_minute=60))
    for i in range(60):
        assert book.admits(one(), float(i)) is None
        book.debit(i, one(), float(i))
        book.release(i, float(i))
    # 60 placed in seconds 0..59: the 61st waits until second 0 leaves the window.
    assert book.admits(one(), 60.0) == Wait("b", REQUESTS_PER_MINUTE, float(HOLD_SECONDS))
    assert book.admits(one(), 60.9) is not None
    assert book.admits(one(), 61.0) is None
    state = book.state("b", 61.0)
    assert state is not None and state.used == Usage(59, 0)


def test_reservations_alone_over_the_limit_wait_for_an_event() -> None:
    book = book_with(BudgetSpec("b", tokens_per_minute=1000))
    book.debit("long", one(tokens=1000), 0.0)
    # Reserved for as long as the attempt runs, a minute or an hour.
    wait = book.admits(one(tokens=1), 3600.0)
    assert wait == Wait("b", TOKENS_PER_MINUTE, None)
    book.correct("long", {"b": Usage(1, 400)}, 3600.0)
    state = book.state("b", 3600.0)
    assert state is not None
    assert (state.used, state.reserved) == (Usage(1, 400), Usage(0, 600))
    assert state.available_tokens == 0


# -- corrections ------------------------------------------------------------------------


def test_usage_above_the_estimate_brings_the_grant_rate_to_actual_usage() -> None:
    # 6,000 tokens a minute, estimates of 1,000, each attempt spends 3,000 and reports it
    # at once: two attempts a minute once the reports come in (the pace would allow six).
    book = book_with(BudgetSpec("b", tokens_per_minute=6000))
    granted: list[float] = []
    now = 0.0
    while now < 600:
        if book.admits(one(tokens=1000), now) is None:
            grant = len(granted)
            book.debit(grant, one(tokens=1000), now)
            book.correct(grant, {"b": Usage(1, 3000)}, now + 1, final=True)
            book.release(grant, now + 1)
            granted.append(now)
        now += 0.5
    per_minute = [sum(1 for t in granted if m * 60 <= t < (m + 1) * 60) for m in range(10)]
    assert per_minute[0] <= 2 + 1  # the first grants go before any report
    assert all(count == 2 for count in per_minute[2:]), per_minute


def test_usage_above_the_estimate_advances_the_pace_too() -> None:
    book = book_with(BudgetSpec("b", tokens_per_minute=100))
    book.debit("g", one(tokens=10), 0.0)  # paced to 6 s
    book.correct("g", {"b": Usage(1, 40)}, 0.0)  # 30 more: 18 s more
    # The window has room for 10 more; the pace says when.
    assert book.admits(one(tokens=10), 10.0) == Wait("b", TOKENS_PER_MINUTE, 24.0)
    assert book.admits(one(tokens=10), 24.0) is None


def test_reports_are_cumulative_and_only_an_increase_counts() -> None:
    book = book_with(BudgetSpec("b", tokens_per_minute=10_000))
    book.debit("g", one(tokens=1000), 0.0)
    book.correct("g", {"b": Usage(1, 600)}, 5.0)
    book.correct("g", {"b": Usage(1, 600)}, 6.0)  # a retried heartbeat
    book.correct("g", {"b": Usage(1, 500)}, 7.0)  # lower: changes nothing
    state = book.state("b", 7.0)
    assert state is not None and (state.used, state.reserved) == (Usage(1, 600), Usage(0, 400))
    book.correct("g", {"b": Usage(2, 1500), "other": Usage(9, 9)}, 8.0)
    state = book.state("b", 8.0)
    assert state is not None and (state.used, state.reserved) == (Usage(2, 1500), Usage(0, 0))
    assert book.accounted("g") == {"b": Usage(2, 1500)}


def test_a_final_report_below_the_estimate_gives_the_rest_back() -> None:
    book = book_with(BudgetSpec("b", tokens_per_minute=3000))
    book.debit("g", one(tokens=2000), 0.0)
    assert book.admits(one(tokens=2000), 30.0) is not None
    book.correct("g", {"b": Usage(1, 500)}, 30.0, final=True)
    state = book.state("b", 30.0)
    assert state is not None and (state.used, state.reserved) == (Usage(1, 500), Usage(0, 0))
    # Room for another 2,000 at once: the pace took the unspent 1,500 back too.
    assert book.admits(one(tokens=2000), 30.0) is None
    assert book.release("g", 31.0) == {"b": Usage(1, 500)}
    assert book.state("b", 31.0).used == Usage(1, 500)  # type: ignore[union-attr]


def test_a_reclaimed_attempts_unreported_estimate_stays_spent_for_the_minute_after_its_end() -> (
    None
):
    book = book_with(BudgetSpec("b", requests_per_minute=100, tokens_per_minute=1000))
    book.debit("g", one(requests=2, tokens=1000), 0.0)
    book.correct("g", {"b": Usage(1, 300)}, 30.0)
    # Reclaimed at 100 s, long after its grant: the 700 tokens it did not report are placed
    # at its end and held for a minute from there.
    assert book.release("g", 100.0) == {"b": Usage(2, 1000)}
    state = book.state("b", 100.0)
    assert state is not None
    assert (state.used, state.reserved, state.in_use) == (Usage(1, 700), Usage(0, 0), 0)
    assert book.admits(one(tokens=301), 150.0) == Wait("b", TOKENS_PER_MINUTE, 161.0)
    assert book.admits(one(tokens=300), 150.0) is None
    assert book.state("b", 161.0).used == Usage(0, 0)  # type: ignore[union-attr]


def test_an_attempt_that_reports_nothing_is_accounted_its_estimate() -> None:
    book = book_with(BudgetSpec("b", requests_per_minute=10))
    book.debit("g", {"b": Need(requests=3)}, 0.0)
    # A final report that does not name the budget does not finalize it.
    book.correct("g", {}, 1.0, final=True)
    assert book.release("g", 2.0) == {"b": Usage(3, 0)}
    assert book.state("b", 2.0).used == Usage(3, 0)  # type: ignore[union-attr]


def test_late_news_about_a_grant_no_longer_open_is_ignored() -> None:
    book = book_with(BudgetSpec("b", requests_per_minute=10))
    book.debit("g", one(), 0.0)
    assert book.release("g", 1.0) == {"b": Usage(1, 0)}
    assert book.release("g", 2.0) == {}
    book.correct("g", {"b": Usage(5, 5)}, 3.0, final=True)
    assert book.state("b", 3.0).used == Usage(1, 0)  # type: ignore[union-attr]


# -- concurrency, throttles -------------------------------------------------------------


def test_max_concurrent_holds_and_a_claim_ending_gives_it_back() -> None:
    book = book_with(BudgetSpec("b", max_concurrent=2))
    book.debit("g1", one(), 0.0)
    book.debit("g2", one(), 0.0)
    assert book.admits(one(), 1.0) == Wait("b", MAX_CONCURRENT, None)
    book.release("g1", 2.0)  # completed, failed, reclaimed, deleted: the same
    assert book.admits(one(), 2.0) is None
    book.debit("g3", one(), 2.0)
    assert book.state("b", 2.0).in_use == 2  # type: ignore[union-attr]
    assert book.state("b", 2.0).available_concurrency == 0  # type: ignore[union-attr]


def test_a_throttle_stops_every_grant_until_its_end_and_is_only_extended() -> None:
    book = book_with(BudgetSpec("b", requests_per_minute=1000), BudgetSpec("other"))
    assert book.throttle("b", until=10.0)
    assert not book.throttle("nobody", until=10.0)
    book.throttle("b", until=5.0)  # earlier: no change
    for now in (0.0, 5.0, 9.99):
        assert book.admits(one(), now) == Wait("b", THROTTLED, 10.0)
    assert book.admits({"other": Need()}, 1.0) is None  # other budgets go past
    assert book.admits(one(), 10.0) is None
    book.throttle("b", until=20.0)
    assert book.admits(one(), 15.0) == Wait("b", THROTTLED, 20.0)


# -- refunds ----------------------------------------------------------------------------


def test_a_refund_is_an_exact_undo() -> None:
    book = book_with(
        BudgetSpec("b", requests_per_minute=60, tokens_per_minute=6000, max_concurrent=3)
    )
    book.debit("g1", one(tokens=100), 0.0)
    before = book.state("b", 1.0)
    debit = book.debit("g2", one(tokens=100), 1.0)
    assert book.state("b", 1.0) != before
    assert book.refund(debit)
    assert book.state("b", 1.0) == before
    assert not book.refund(debit)  # already undone
    assert not book.holds("g2")


def test_a_grant_with_reports_is_released_not_refunded() -> None:
    book = book_with(BudgetSpec("b", tokens_per_minute=600))
    debit = book.debit("g", one(tokens=100), 0.0)
    book.correct("g", {"b": Usage(1, 50)}, 1.0)
    with pytest.raises(ValueError, match="release it instead"):
        book.refund(debit)


# -- budgets coming and going -----------------------------------------------------------


def test_deleting_and_recreating_a_budget_is_no_reset() -> None:
    book = book_with(BudgetSpec("b", requests_per_minute=2))
    book.debit("g1", one(), 0.0)
    book.release("g1", 0.0)
    book.debit("g2", one(), 30.0)
    book.remove_budget("b")
    assert book.admits(one(), 31.0) == Wait("b", BUDGET_NOT_FOUND)
    book.upsert_budget(BudgetSpec("b", requests_per_minute=2))
    assert book.admits(one(), 31.0) is not None  # still two in the minute
    book.release("g2", 40.0)
    book.remove_budget("b")
    assert book.budgets() == ["b"]  # its minute is not over
    book.prune(200.0)
    assert book.budgets() == []


def test_values_are_checked() -> None:
    with pytest.raises(ValueError):
        BudgetSpec("b", requests_per_minute=0)
    with pytest.raises(ValueError):
        BudgetSpec("b", tokens_per_minute=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        BudgetSpec("")
    with pytest.raises(ValueError):
        Need(requests=-1)
    with pytest.raises(ValueError):
        Usage(tokens=1.5)  # type: ignore[arg-type]
    book = book_with(BudgetSpec("b"))
    book.debit("g", one(), 0.0)
    with pytest.raises(ValueError, match="already open"):
        book.debit("g", one(), 0.0)


# -- the persisted window and restores --------------------------------------------------


def test_the_window_groups_placements_in_buckets_without_reservations() -> None:
    book = book_with(BudgetSpec("b", tokens_per_minute=10_000))
    for i, at in enumerate((1.0, 3.5, 7.0, 12.0)):
        book.debit(i, one(tokens=100), at)
        book.release(i, at)
    book.debit("open", one(tokens=500), 13.0)
    window = book.window("b", 14.0)
    assert window == Window(
        as_of=14.0,
        bucket_seconds=5,
        buckets=((0.0, Usage(2, 200)), (5.0, Usage(1, 100)), (10.0, Usage(1, 100))),
    )
    # Second 1 leaves at 62, second 3 at 64.
    assert book.window("b", 62.5).buckets[0] == (0.0, Usage(1, 100))
    assert book.window("b", 64.0).buckets == ((5.0, Usage(1, 100)), (10.0, Usage(1, 100)))
    assert book.window("nobody", 1.0).buckets == ()


def test_a_restart_in_the_middle_of_a_minute_grants_no_more_than_the_limit_in_it() -> None:
    limit = 12  # one every 5 s
    old = book_with(BudgetSpec("b", requests_per_minute=limit))
    granted: list[float] = []
    persisted = None
    for i in range(6):  # six grants in the first 30 s, three of them already ended
        at = 5.0 * i
        old.debit(i, one(), at)
        granted.append(at)
        if i < 3:
            old.release(i, at + 1)
        if at == 20.0:
            persisted = old.window("b", at)  # the status written at 20 s
    assert persisted is not None
    # The new leader at 30 s: the three open claims and the ended attempts' history
    # entries -- except the first, whose task was deleted (the window has it).
    new = book_with(BudgetSpec("b", requests_per_minute=limit))
    new.restore(
        30.0,
        grants=[OpenGrant(i, one(), granted_at=5.0 * i) for i in range(3, 6)],
        ended=[Placement("b", at=5.0 * i + 1, usage=Usage(1, 0)) for i in (1, 2)],
        windows={"b": persisted},
    )
    now = 30.0
    while now < 60.0:
        if new.admits(one(), now) is None:
            new.debit(("new", now), one(), now)
            granted.append(now)
        now += 0.5
    in_first_minute = [t for t in granted if t < 60.0]
    assert len(in_first_minute) <= limit
    # The price: the attempt that ended within the overlap of the window's stamp is
    # counted twice (the window and its task), for a minute.
    assert len(in_first_minute) == limit - 1


def test_a_restore_keeps_claims_reservations_throttles_and_the_pace() -> None:
    book = book_with(BudgetSpec("b", tokens_per_minute=600, max_concurrent=2))
    book.restore(
        100.0,
        grants=[OpenGrant("g", one(tokens=300), granted_at=95.0, usage={"b": Usage(1, 100)})],
        throttles={"b": 104.0},
    )
    state = book.state("b", 100.0)
    assert state is not None
    assert (state.in_use, state.used, state.reserved) == (1, Usage(1, 100), Usage(0, 200))
    assert state.throttled_until == 104.0
    # The pace replayed: 300 of 600 a minute at 95 s -> next at 125 s.
    assert state.tokens_ready_at == 125.0
    assert book.admits(one(tokens=100), 104.0) == Wait("b", TOKENS_PER_MINUTE, 125.0)
    with pytest.raises(ValueError, match="holds grants"):
        book.restore(100.0)
    # The restored grant goes on as any other.
    book.correct("g", {"b": Usage(1, 250)}, 110.0, final=True)
    assert book.release("g", 110.0) == {"b": Usage(1, 250)}


def test_an_ended_attempt_older_than_the_windows_stamp_is_not_counted_twice() -> None:
    window = Window(as_of=50.0, bucket_seconds=5, buckets=((30.0, Usage(1, 100)),))
    book = book_with(BudgetSpec("b", tokens_per_minute=1000))
    book.restore(
        55.0,
        ended=[
            Placement("b", at=32.0, usage=Usage(1, 100)),  # in the window
            Placement("b", at=45.0, usage=Usage(1, 10)),  # within the overlap: counted
        ],
        windows={"b": window},
    )
    assert book.state("b", 55.0).used == Usage(2, 110)  # type: ignore[union-attr]
    # The window's bucket is held until its end plus a second, plus a minute.
    assert book.state("b", 96.9).used.tokens == 110  # type: ignore[union-attr]
    assert book.state("b", 97.0).used.tokens == 10  # type: ignore[union-attr]
    # A window stamped in our future is not trusted to hold anything.
    future = book_with(BudgetSpec("b", tokens_per_minute=1000))
    future.restore(
        55.0,
        ended=[Placement("b", at=32.0, usage=Usage(1, 100))],
        windows={"b": Window(as_of=500.0, bucket_seconds=5)},
    )
    assert future.state("b", 55.0).used == Usage(1, 100)  # type: ignore[union-attr]
