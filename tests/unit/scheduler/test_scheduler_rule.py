"""The dispatch rule, case by case: order, eligibility, ties, and every transition.

Each test runs against both implementations (the capability-group index and
the full-scan reference), so a case documents the rule, not one data structure.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest

from agentq.scheduler import (
    Assignment,
    ReferenceScheduler,
    Scheduler,
    TaskSpec,
    UnknownWorkerError,
    WorkerSpec,
)
from agentq.scheduler.ledger import Ledger

pytestmark = pytest.mark.unit

IMPLEMENTATIONS = [Scheduler, ReferenceScheduler]


def worker(
    name: str,
    caps: str = "",
    *,
    weight: float = 1.0,
    max_in_flight: int = 1000,
    paused: bool = False,
    ready: bool = True,
) -> WorkerSpec:
    """A worker spec; ``caps`` is a comma-separated list (``"gpu,py"``)."""
    return WorkerSpec(
        name=name,
        capabilities=frozenset(c for c in caps.split(",") if c),
        weight=weight,
        max_in_flight=max_in_flight,
        paused=paused,
        ready=ready,
    )


def task(name: str, caps: str = "", *, cost: float = 1.0, avoid: str = "") -> TaskSpec:
    """A task spec; ``caps`` and ``avoid`` are comma-separated lists."""
    return TaskSpec(
        name=name,
        required=frozenset(c for c in caps.split(",") if c),
        cost=cost,
        avoid=frozenset(w for w in avoid.split(",") if w),
    )


def tasks(count: int, caps: str = "", *, cost: float = 1.0, prefix: str = "t") -> list[TaskSpec]:
    return [task(f"{prefix}{i:04d}", caps, cost=cost) for i in range(count)]


def fleet(kind: type[Ledger], *specs: WorkerSpec, credit_cap: float | None = None) -> Ledger:
    core = kind(credit_cap=credit_cap)
    for spec in specs:
        core.upsert_worker(spec)
    return core


@pytest.fixture(params=IMPLEMENTATIONS, ids=["fast", "reference"])
def kind(request: pytest.FixtureRequest) -> type[Ledger]:
    implementation: type[Ledger] = request.param
    return implementation


# -- the order of decisions -----------------------------------------------------------------


def test_equal_weights_and_costs_give_round_robin_order(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("c"), worker("a"), worker("b"))
    chosen = [a.worker for a in core.plan(tasks(9))]
    assert chosen == ["a", "b", "c"] * 3


def test_round_robin_continues_across_batches_and_completions(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a"), worker("b"), worker("c"))
    first = core.plan(tasks(2, prefix="x"))
    assert [a.worker for a in first] == ["a", "b"]
    for a in first:
        core.release(a.task, completed=True)
    # c has not had its turn yet: it goes first, then the rotation carries on.
    assert [a.worker for a in core.plan(tasks(4, prefix="y"))] == ["c", "a", "b", "c"]


def test_all_weights_one_with_equal_credit_give_least_loaded(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a"), worker("b"), worker("c"))
    # Restored assignments add load without spending credit: credit stays equal.
    core.restore(Assignment("old-a1", "a", 2.0))
    core.restore(Assignment("old-a2", "a", 1.0))
    core.restore(Assignment("old-c", "c", 1.0))
    assert [a.worker for a in core.plan([task("t")])] == ["b"]


@pytest.mark.parametrize(
    ("loads", "expected"),
    [
        ({"a": 3.0, "b": 1.0, "c": 2.0}, "b"),
        ({"a": 0.5, "b": 1.0, "c": 2.0}, "a"),
        ({"a": 2.0, "b": 2.0, "c": 2.0}, "a"),  # a tie: the smallest name
        ({"a": 2.0, "b": 2.0}, "c"),
    ],
    ids=["b-lightest", "a-lightest", "tie-by-name", "idle-worker"],
)
def test_least_loaded_table(kind: type[Ledger], loads: dict[str, float], expected: str) -> None:
    core = fleet(kind, worker("a"), worker("b"), worker("c"))
    for name, load in loads.items():
        core.restore(Assignment(f"held-{name}", name, load))
    assert core.plan([task("t")])[0].worker == expected


def test_weights_set_the_share_of_cost(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("x", weight=1), worker("y", weight=2), worker("z", weight=4))
    counts = Counter(a.worker for a in core.plan(tasks(700)))
    assert counts == {"x": 100, "y": 200, "z": 400}


def test_costs_are_shared_not_counts(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a"), worker("b"))
    # a takes a task of cost 5; b must then take five unit tasks before a's turn.
    core.plan([task("big", cost=5.0)])
    chosen = [a.worker for a in core.plan(tasks(6))]
    assert chosen == ["b", "b", "b", "b", "b", "a"]


def test_a_heavier_worker_is_interleaved_not_served_in_a_burst(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a", weight=1), worker("b", weight=3))
    chosen = "".join(a.worker for a in core.plan(tasks(8)))
    assert chosen == "abbbabbb"


def test_the_same_calls_give_the_same_decisions(kind: type[Ledger]) -> None:
    def run() -> list[Assignment]:
        core = fleet(kind, *(worker(f"w{i}", weight=1 + i % 3) for i in range(7)))
        decided = core.plan([task(f"t{i}", cost=1 + (i * 7) % 5) for i in range(50)])
        for a in decided[::3]:
            core.release(a.task, completed=True)
        return decided + core.plan([task(f"u{i}", cost=2) for i in range(20)])

    assert run() == run()


def test_ties_go_to_the_smallest_name_whatever_the_join_order(kind: type[Ledger]) -> None:
    for order in (["b", "a", "c"], ["c", "b", "a"], ["a", "c", "b"]):
        core = fleet(kind, *(worker(name) for name in order))
        assert core.plan([task("t")])[0].worker == "a"


# -- who may be chosen ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("specs", "required", "expected"),
    [
        ([worker("a", "py"), worker("b", "gpu,py")], "gpu", {"b"}),
        ([worker("a", "py"), worker("b", "gpu")], "gpu,py", set()),
        ([worker("a", "py"), worker("b", "gpu,py")], "", {"a", "b"}),
        ([worker("a", "gpu", paused=True), worker("b", "gpu")], "gpu", {"b"}),
        ([worker("a", "gpu", ready=False), worker("b", "gpu")], "gpu", {"b"}),
        ([worker("a", "gpu", paused=True)], "gpu", set()),
    ],
    ids=["superset", "nobody-covers", "no-requirement", "paused", "not-ready", "only-paused"],
)
def test_eligibility_table(
    kind: type[Ledger], specs: list[WorkerSpec], required: str, expected: set[str]
) -> None:
    core = fleet(kind, *specs)
    chosen = {a.worker for a in core.plan(tasks(6, required))}
    assert chosen == expected


def test_capabilities_are_never_violated(kind: type[Ledger]) -> None:
    specs = [worker("cpu1", "py"), worker("cpu2", "py,go"), worker("gpu1", "gpu,py", weight=4)]
    core = fleet(kind, *specs)
    by_name = {s.name: s for s in specs}
    batch = tasks(30, "py", prefix="p") + tasks(30, "gpu", prefix="g") + tasks(30, "go", prefix="o")
    wanted = {t.name: t.required for t in batch}
    for a in core.plan(batch):
        assert wanted[a.task] <= by_name[a.worker].capabilities


def test_a_full_worker_is_never_chosen(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a", max_in_flight=1), worker("b", max_in_flight=2))
    decided = core.plan(tasks(5))
    assert [a.worker for a in decided] == ["a", "b", "b"]  # then everyone is full
    core.release(decided[0].task, completed=True)
    assert [a.worker for a in core.plan([task("late")])] == ["a"]


def test_a_task_nobody_can_take_is_skipped_and_later_ones_still_go(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a", "py"))
    decided = core.plan([task("t1", "gpu"), task("t2", "py")])
    assert decided == [Assignment("t2", "a", 1.0)]


# -- a re-dispatch prefers another worker ----------------------------------------------------


@pytest.mark.parametrize(
    ("specs", "caps", "avoid", "expected"),
    [
        # the rule's own choice is avoided: the next best eligible worker
        ([worker("a"), worker("b"), worker("c")], "", "a", "b"),
        ([worker("a"), worker("b"), worker("c")], "", "a,b", "c"),
        # avoiding a worker the rule would not choose changes nothing
        ([worker("a"), worker("b")], "", "b", "a"),
        # every eligible worker avoided: the best of them (nothing starves)
        ([worker("a"), worker("b")], "", "a,b", "a"),
        # the only other worker cannot take it (capabilities, full, paused, not ready)
        ([worker("a", "gpu"), worker("b", "py")], "gpu", "a", "a"),
        ([worker("a"), worker("b", max_in_flight=1)], "", "a", "a"),
        ([worker("a"), worker("b", paused=True)], "", "a", "a"),
        ([worker("a"), worker("b", ready=False)], "", "a", "a"),
        # across capability groups: the best non-avoided worker of any covering group
        ([worker("a", "gpu,py"), worker("b", "py"), worker("c", "gpu,py")], "py", "a", "b"),
        ([worker("a", "gpu,py"), worker("b", "py"), worker("c", "gpu,py")], "py", "a,b", "c"),
        # names the core does not know are ignored
        ([worker("a"), worker("b")], "", "zz", "a"),
    ],
    ids=[
        "next-best",
        "two-avoided",
        "not-the-choice",
        "all-avoided",
        "other-lacks-capability",
        "other-full",
        "other-paused",
        "other-not-ready",
        "across-groups",
        "across-groups-two",
        "unknown-name",
    ],
)
def test_a_task_goes_to_a_worker_outside_its_avoid_set_when_one_is_eligible(
    kind: type[Ledger], specs: list[WorkerSpec], caps: str, avoid: str, expected: str
) -> None:
    core = fleet(kind, *specs)
    if any(s.name == "b" and s.max_in_flight == 1 for s in specs):
        core.restore(Assignment("held", "b", 1.0))  # b is full
    (decided,) = core.plan([task("t", caps, avoid=avoid)])
    assert decided.worker == expected


def test_an_avoided_worker_keeps_its_credit_and_is_chosen_next(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a"), worker("b"), worker("c"))
    first = core.plan([task("t1", avoid="a")])
    assert first[0].worker == "b"
    # a was not charged: it is still owed its turn, and takes the next task.
    assert core.worker_state("a").deficit > core.worker_state("b").deficit
    assert [d.worker for d in core.plan([task("t2"), task("t3")])] == ["a", "c"]


def test_an_avoided_capped_worker_is_looked_past_too(kind: type[Ledger]) -> None:
    """Workers idle long enough to be at the credit cap sit in the index's "capped"
    heap: the avoid set applies there as in the open heap."""
    core = fleet(kind, worker("a"), worker("b"), worker("c"), worker("busy"), credit_cap=0.5)
    core.plan([task(f"x{i}", avoid="a,b,c") for i in range(6)])  # a, b, c bank to the cap
    (decided,) = core.plan([task("t", avoid="a")])
    assert decided.worker == "b"


# -- transitions ----------------------------------------------------------------------------


def test_abort_undoes_the_decision_exactly(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a"), worker("b", weight=2))
    core.plan(tasks(5, prefix="warm"))
    before = {name: core.worker_state(name) for name in core.workers()}
    vtime = core.virtual_time
    (decision,) = core.plan([task("t", cost=3.0)])
    core.abort(decision)
    assert {name: core.worker_state(name) for name in core.workers()} == before
    assert core.virtual_time == pytest.approx(vtime)
    assert core.plan([task("t", cost=3.0)]) == [decision]  # the same decision again


def test_abort_of_something_not_held_is_ignored_but_a_wrong_worker_is_an_error(
    kind: type[Ledger],
) -> None:
    core = fleet(kind, worker("a"), worker("b"))
    (decision,) = core.plan([task("t")])
    with pytest.raises(ValueError, match="held by 'a'"):
        core.abort(Assignment("t", "b", 1.0))
    core.release("t", completed=True)
    core.abort(decision)  # already released: nothing to undo
    assert core.worker_state("a").in_flight == 0


def test_completion_releases_load_and_counts_served_cost(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a"))
    core.plan([task("t", cost=2.5)])
    deficit = core.worker_state("a").deficit
    core.release("t", completed=True)
    state = core.worker_state("a")
    assert (state.in_flight, state.in_flight_cost, state.served_cost) == (0, 0.0, 2.5)
    assert state.deficit == deficit  # completion refunds nothing


def test_a_reclaim_releases_load_without_refund_or_service(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a"), worker("b"))
    core.plan([task("t", cost=2.0)])
    core.release("t", completed=False)
    state = core.worker_state("a")
    assert (state.in_flight, state.in_flight_cost, state.served_cost) == (0, 0.0, 0.0)
    # a spent its turn on the failed attempt, so the re-dispatch prefers b.
    assert core.plan([task("t", cost=2.0)])[0].worker == "b"


def test_releasing_an_unknown_task_is_ignored(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a"))
    core.release("nope", completed=True)
    assert core.worker_state("a").served_cost == 0


def test_planning_a_task_still_held_releases_the_old_hold_first(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a"), worker("b"))
    core.plan([task("t")])
    (again,) = core.plan([task("t")])
    assert again.worker == "b"
    assert core.worker_state("a").tasks == frozenset()
    assert core.holder("t") == "b"


def test_a_batch_naming_a_task_twice_is_refused_before_any_decision(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a"))
    with pytest.raises(ValueError, match="listed twice"):
        core.plan([task("t1"), task("t2"), task("t1")])
    assert core.worker_state("a").in_flight == 0


def test_remove_worker_returns_its_tasks_and_forgets_them(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a"), worker("b"))
    core.plan(tasks(4))
    assert core.remove_worker("a") == ["t0000", "t0002"]
    assert core.workers() == ["b"]
    assert core.holder("t0000") is None
    core.release("t0000", completed=True)  # the caller's late news is harmless
    with pytest.raises(UnknownWorkerError):
        core.worker_state("a")
    with pytest.raises(UnknownWorkerError):
        core.remove_worker("a")


def test_restore_charges_no_credit_and_is_idempotent(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a"), worker("b"))
    held = Assignment("t", "a", 2.0)
    core.restore(held)
    core.restore(held)
    state = core.worker_state("a")
    assert (state.deficit, state.in_flight, state.in_flight_cost) == (0.0, 1, 2.0)
    assert core.virtual_time == 0.0


def test_restore_moves_a_task_the_core_placed_elsewhere(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a"), worker("b"))
    core.plan([task("t")])
    core.restore(Assignment("t", "b", 1.0))
    assert core.holder("t") == "b"
    assert core.worker_state("a").in_flight == 0
    with pytest.raises(UnknownWorkerError):
        core.restore(Assignment("u", "ghost", 1.0))


def test_a_new_worker_starts_with_zero_credit(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a"), worker("b"))
    core.plan(tasks(10))
    core.upsert_worker(worker("c"))
    assert core.worker_state("c").deficit == 0.0


def test_a_paused_worker_keeps_but_does_not_earn_credit(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a"), worker("b"), worker("c"), credit_cap=100.0)
    core.plan([task("first")])  # a is charged; b and c are owed
    core.upsert_worker(worker("b", paused=True))
    frozen = core.worker_state("b").deficit
    assert frozen > 0
    core.plan(tasks(6))
    assert core.worker_state("b").deficit == frozen
    core.upsert_worker(worker("b"))
    assert core.worker_state("b").deficit == pytest.approx(frozen)


def test_pausing_keeps_current_tasks(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a"))
    core.plan([task("t")])
    core.upsert_worker(worker("a", paused=True))
    assert core.worker_state("a").tasks == {"t"}
    assert core.plan([task("u")]) == []


def test_a_weight_change_keeps_credit(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a"), worker("b"), credit_cap=100.0)
    core.plan([task("t")])
    owed = core.worker_state("b").deficit
    core.upsert_worker(worker("b", weight=3))
    assert core.worker_state("b").deficit == pytest.approx(owed)


def test_a_capability_change_moves_the_worker(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a", "py"))
    assert core.plan([task("g1", "gpu")]) == []
    core.upsert_worker(worker("a", "gpu"))
    assert [a.worker for a in core.plan([task("g1", "gpu"), task("p1", "py")])] == ["a"]


def test_idle_workers_cannot_bank_more_than_the_cap(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("cpu", "py"), worker("gpu", "gpu", weight=2), credit_cap=3.0)
    for a in core.plan(tasks(500, "py")):  # gpu earns credit all along, but no gpu task comes
        core.release(a.task, completed=True)
    assert core.worker_state("gpu").deficit == pytest.approx(2 * 3.0)
    # cpu did all the work, but that is no debt: rounds advanced with it.
    assert core.worker_state("cpu").deficit >= -1.0
    # When work both can do appears, gpu's burst is bounded by its capped credit
    # (2 x 3.0 = 6 cost units, spent 1 per task while its load grows), then they alternate.
    chosen = "".join(a.worker[0] for a in core.plan(tasks(12, "", prefix="any")))
    assert chosen == "ggggcggcggcg"


def test_the_default_cap_follows_the_largest_task_and_the_mean_weight(kind: type[Ledger]) -> None:
    core = fleet(kind, worker("a", weight=1), worker("b", weight=3))
    core.plan([task("t", cost=5.0)])
    assert core.cap_rounds == pytest.approx(2 * 5.0 / 2.0)
    core.upsert_worker(worker("c", "gpu", weight=2))
    core.plan(tasks(200, ""))
    assert core.worker_state("c").deficit <= 2 * core.cap_rounds + 1e-9


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: worker("a", weight=0), "weight"),
        (lambda: worker("a", weight=math.inf), "weight"),
        (lambda: worker("a", max_in_flight=0), "max_in_flight"),
        (lambda: task("t", cost=-1), "cost"),
        (lambda: task("t", cost=math.nan), "cost"),
        (lambda: Scheduler(credit_cap=0), "credit_cap"),
    ],
    ids=["zero-weight", "infinite-weight", "no-slots", "negative-cost", "nan-cost", "zero-cap"],
)
def test_bad_values_are_refused_where_they_are_built(build: object, message: str) -> None:
    assert callable(build)
    with pytest.raises(ValueError, match=message):
        build()


def test_when_the_cap_rises_capped_workers_count_their_credit_up_to_the_new_cap(
    kind: type[Ledger],
) -> None:
    """b and c sit idle at the cap, told apart only by load; a larger task raises
    the (default) cap and their real credit counts again: b, less served, wins."""
    core = fleet(kind, worker("a", "x"), worker("b", "y"), worker("c", "y"), worker("d", "y"))
    core.restore(Assignment("held-b", "b", 0.28))
    assert core.plan([task("c1", "y", cost=0.15)])[0].worker == "c"  # c: tag .15, load .15
    for i in range(9):  # a works alone; b, c, d bank credit up to the cap
        core.release(core.plan([task(f"x{i}", "x")])[0].task, completed=True)
    # At the cap only loads differ: d (idle) first, and b and c stay capped.
    assert core.plan([task("y1", "y")])[0].worker == "d"
    # Cost 10 raises the cap to 20 rounds: b's 0 + .28 now beats c's .15 + .15.
    assert core.plan([task("big", "y", cost=10.0)])[0].worker == "b"


def test_after_an_abort_steps_rounds_back_capped_workers_are_judged_afresh(
    kind: type[Ledger],
) -> None:
    core = fleet(
        kind,
        worker("a", "x"),
        worker("b", "y"),
        worker("c", "y"),
        worker("d", "y"),
        credit_cap=2.0,
    )
    core.restore(Assignment("held-b", "b", 0.28))
    assert core.plan([task("c1", "y", cost=0.15)])[0].worker == "c"
    # A huge x decision pushes V far up: in the same batch b, c and d are all at
    # the cap, told apart by load only, and idle d wins.
    huge, y2 = core.plan([task("huge", "x", cost=50.0), task("y2", "y")])
    assert (huge.worker, y2.worker) == ("a", "d")
    # The huge commit fails: V steps back, nobody is at the cap any more, and b
    # (less served: tag 0 + load .28 against c's .15 + .15) is chosen.
    core.abort(huge)
    assert core.plan([task("y3", "y")])[0].worker == "b"
