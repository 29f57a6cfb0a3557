"""Provider budgets gate dispatch (docs/budgets.md, issue 21), on the in-memory API server:
the book admits before the worker level is asked, a refusal holds only its own set, a
grant not made is refunded, a claim that ends -- however it ends -- gives its budget
back, the verdicts and the waits say so on the task, and a new leader restores."""

from __future__ import annotations

import json
import random
from typing import Any

from agentq.operator.controller import Controller
from agentq.operator.port import KubeError, Status
from builders import budget, task
from harness import NS, Harness, run


def assigned(h: Harness) -> set[str]:
    return {
        name
        for (plural, _, name), body in h.kube.objects.items()
        if plural == "agenttasks"
        and (body.get("status") or {}).get("phase") in ("Assigned", "Running")
    }


def book_grants(h: Harness) -> set[str]:
    return {str(g[1]) for g in h.controller.cores.budgets.book.grants()}  # type: ignore[index]


async def pool(h: Harness, *, slots: int = 100) -> None:
    h.worker("w1", "llm", max_in_flight=slots, lease_seconds=100_000)
    await h.settle()


def budgeted(name: str, *budgets: str, requests: int | None = None) -> Any:
    builder = task(name).requires("llm")
    for b in budgets:
        builder = builder.budget(b, requests=requests)
    return builder


# -- the gate ----------------------------------------------------------------------------


@run
async def test_requests_per_minute_paces_the_grants_one_a_second() -> None:
    h = Harness()
    await pool(h)
    h.budget(budget("openai").requests_per_minute(60))
    for i in range(5):
        h.task(
            budgeted(f"t{i}", "openai").set("metadata.creationTimestamp", f"2026-01-01T00:00:0{i}Z")
        )
    await h.settle()
    assert assigned(h) == {"t0"}  # the pace: one a second, not five at once
    for n in range(2, 6):
        await h.advance(1.0)
        assert len(assigned(h)) == n
    assert book_grants(h) == {f"t{i}" for i in range(5)}


@run
async def test_a_refused_set_blocks_no_other_set_or_lane() -> None:
    h = Harness()
    await pool(h)
    h.budget(budget("one").max_concurrent(1))
    h.budget(budget("other").max_concurrent(5))
    h.task(budgeted("a1", "one").set("metadata.creationTimestamp", "2026-01-01T00:00:01Z"))
    h.task(
        budgeted("a2", "one").set("metadata.creationTimestamp", "2026-01-01T00:00:02Z")
    )  # waits for a1
    h.task(
        task("free").requires("llm").set("metadata.creationTimestamp", "2026-01-01T00:00:03Z")
    )  # no budget
    h.task(budgeted("b1", "other").set("metadata.creationTimestamp", "2026-01-01T00:00:04Z"))
    await h.settle()
    assert assigned(h) == {"a1", "free", "b1"}
    assert book_grants(h) == {"a1", "b1"}  # a task naming no budget never reaches the book


@run
async def test_a_task_without_budgets_never_touches_the_book() -> None:
    h = Harness()
    await pool(h)
    h.task(task("plain").requires("llm"))
    await h.settle()
    assert assigned(h) == {"plain"}
    assert not h.controller.cores.budgets.open and not h.controller.cores.budgets.book.grants()


async def one_slot(h: Harness) -> None:
    """A budget of one concurrent claim, ``first`` holding it, ``second`` waiting."""
    await pool(h)
    h.budget(budget("one").max_concurrent(1))
    h.task(budgeted("first", "one").set("metadata.creationTimestamp", "2026-01-01T00:00:01Z"))
    h.task(budgeted("second", "one").set("metadata.creationTimestamp", "2026-01-01T00:00:02Z"))
    await h.settle()
    assert assigned(h) == {"first"}


async def second_granted(h: Harness) -> None:
    await h.settle()
    assert "second" in assigned(h), h.status("second")
    assert book_grants(h) == {"second"}


@run
async def test_a_success_gives_the_concurrency_back() -> None:
    h = Harness()
    await one_slot(h)
    h.renew("first")
    await h.settle()
    h.report("first", outcome="Succeeded", result={})
    await second_granted(h)


@run
async def test_a_failure_gives_the_concurrency_back() -> None:
    h = Harness()
    await one_slot(h)
    h.renew("first")
    await h.settle()
    h.report("first", outcome="Failed", error={"reason": "Boom", "retryable": False})
    await second_granted(h)


@run
async def test_a_reclaimed_claim_gives_the_concurrency_back() -> None:
    h = Harness()
    await one_slot(h)
    h.renew("first")
    await h.settle()
    h.report("first", outcome="Failed", error={"reason": "Flaky", "retryable": True})
    await h.settle()
    # Requeued, and granted again (the older of the two): its first attempt's claim was
    # released, its second one holds the budget's one slot.
    assert h.status("first")["attempt"] == 2
    assert assigned(h) == {"first"} and book_grants(h) == {"first"}
    assert h.controller.cores.budgets.book.state("one", h.clock.monotonic()).in_use == 1


@run
async def test_an_expired_lease_gives_the_concurrency_back() -> None:
    h = Harness()
    await one_slot(h)
    await h.advance(2000)  # nobody renews: the claim is reclaimed
    assert "first" not in assigned(h) or "second" in assigned(h)
    assert len(assigned(h)) <= 1


@run
async def test_a_cancelled_task_gives_the_concurrency_back() -> None:
    h = Harness()
    await one_slot(h)
    h.kube.edit("agenttasks", NS, "first", lambda b: b["spec"].__setitem__("cancel", True))
    await h.settle()
    await h.advance(60)
    await second_granted(h)


@run
async def test_a_deleted_task_gives_the_concurrency_back() -> None:
    h = Harness()
    await one_slot(h)
    h.delete_task("first")
    await second_granted(h)


@run
async def test_a_lost_grant_is_refunded_and_granted_again() -> None:
    h = Harness()
    await pool(h)
    h.budget(budget("one").max_concurrent(1))
    h.kube.inject(
        "patch_status",
        Status.CONFLICT,
        when=lambda a: a[0] == "agenttasks" and a[2] == "t",
        times=1,
    )
    h.task(budgeted("t", "one"))
    await h.settle()
    assert assigned(h) == set()
    assert book_grants(h) == set()  # refunded
    # The newer version a 409 stands for: granted again, the refund made room for it.
    h.kube.edit("agenttasks", NS, "t", lambda b: b["metadata"].setdefault("labels", {}))
    await h.settle()
    assert assigned(h) == {"t"}
    assert book_grants(h) == {"t"}
    assert h.controller.cores.budgets.book.state("one", h.clock.monotonic()).in_use == 1


@run
async def test_a_grant_of_unknown_outcome_holds_its_budget_until_the_store_says() -> None:
    h = Harness()
    await pool(h)
    h.budget(budget("one").max_concurrent(1))
    h.kube.inject(
        "patch_status",
        KubeError("timeout"),
        when=lambda a: a[0] == "agenttasks" and a[2] == "t",
        times=1,
    )
    h.task(budgeted("t", "one"))
    h.task(budgeted("u", "one").set("metadata.creationTimestamp", "2099-01-01T00:00:00Z"))
    await h.settle()
    assert assigned(h) == set()
    assert book_grants(h) == {"t"}  # held: it may have landed; u may not take it
    await h.advance(31)  # the doubt ends: it did not land, refunded, granted again
    assert assigned(h) == {"t"}
    assert book_grants(h) == {"t"}


# -- what the task says ------------------------------------------------------------------


@run
async def test_an_unknown_budget_is_a_verdict_with_a_warning_until_it_exists() -> None:
    h = Harness()
    await pool(h)
    h.task(budgeted("t", "nowhere"))
    await h.settle()
    cond = h.condition("t", "Budgeted")
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "BudgetNotFound")
    assert "BudgetNotFound" in h.kube.reasons("t")
    assert assigned(h) == set()
    h.budget(budget("nowhere").requests_per_minute(10))
    await h.settle()
    assert assigned(h) == {"t"}
    assert h.condition("t", "Budgeted") is None  # dropped by the grant


@run
async def test_an_estimate_above_the_limit_is_flagged_and_others_go_past() -> None:
    h = Harness()
    await pool(h)
    h.budget(budget("small").requests_per_minute(5))
    h.task(
        budgeted("big", "small", requests=10).set(
            "metadata.creationTimestamp", "2026-01-01T00:00:01Z"
        )
    )
    h.task(
        budgeted("fits", "small", requests=1).set(
            "metadata.creationTimestamp", "2026-01-01T00:00:02Z"
        )
    )
    await h.settle()
    cond = h.condition("big", "Budgeted")
    assert cond is not None and cond["reason"] == "EstimateExceedsLimit", cond
    assert assigned(h) == {"fits"}
    h.kube.edit(
        "agentbudgets", "", "small", lambda b: b["spec"].__setitem__("requestsPerMinute", 20)
    )
    await h.advance(15)
    assert "big" in assigned(h)


@run
async def test_a_wait_says_its_reason_after_five_seconds_and_the_grant_drops_it() -> None:
    h = Harness()
    await one_slot(h)
    await h.advance(2)
    assert h.condition("second", "Budgeted") is None  # not on every refusal
    await h.advance(4)
    cond = h.condition("second", "Budgeted")
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "MaxConcurrent")
    assert "one" in cond["message"]
    h.delete_task("first")
    await second_granted(h)
    assert h.condition("second", "Budgeted") is None


# -- a new leader ------------------------------------------------------------------------


def restarted(h: Harness) -> Controller:
    """A new operator on the same API server: its store from a fresh list."""
    c = Controller(kube=h.kube, clock=h.clock, config=h.config, rng=random.Random(2), strict=True)
    h.kube._subscribers[:] = [lambda plural, kind, body: c.observe(plural, kind, body)]
    for (plural, _, _), body in sorted(h.kube.objects.items()):
        c.observe(plural, "ADDED", dict(body))
    c.set_synced()
    h.controller = c
    return c


async def finish_new(h: Harness, grants: dict[tuple[str, int], float]) -> None:
    """Each attempt granted since the last look: its time noted, and it succeeds at once."""
    for name in sorted(assigned(h)):
        attempt = h.status(name)["attempt"]
        if (name, attempt) not in grants:
            grants[(name, attempt)] = h.clock.monotonic()
            h.renew(name)
            await h.settle()
            h.report(name, outcome="Succeeded", result={})
            await h.settle()


@run
async def test_a_restart_mid_minute_grants_no_more_than_the_limit() -> None:
    h = Harness()
    await pool(h)
    h.budget(budget("two").requests_per_minute(2))
    for i in range(4):
        h.task(
            budgeted(f"t{i}", "two").set("metadata.creationTimestamp", f"2026-01-01T00:00:0{i}Z")
        )
    await h.settle()
    grants: dict[tuple[str, int], float] = {}
    for _ in range(35):
        await finish_new(h, grants)
        await h.advance(1)
    assert set(grants) == {("t0", 1), ("t1", 1)}  # two requests spent in this minute
    restarted(h)  # mid-minute: a new operator, its book from the statuses alone
    for _ in range(90):
        await h.advance(1)
        await finish_new(h, grants)
    times = sorted(grants.values())
    for i, start in enumerate(times):
        inside = [t for t in times[i:] if t < start + 60]
        assert len(inside) <= 2, (grants, start)
    assert ("t3", 1) in grants  # and it goes on as the minute slides


@run
async def test_a_restart_keeps_the_running_claims_concurrency() -> None:
    h = Harness()
    await one_slot(h)
    restarted(h)
    await h.settle()
    await h.advance(5)
    assert assigned(h) == {"first"}
    assert book_grants(h) == {"first"}
    h.delete_task("first")
    await second_granted(h)


# -- AgentBudget.status ------------------------------------------------------------------


@run
async def test_the_leader_writes_the_budget_status_with_its_window() -> None:
    h = Harness()
    await pool(h)
    h.budget(budget("two").requests_per_minute(2).max_concurrent(5))
    h.task(budgeted("a", "two"))
    await h.settle()
    await h.advance(3)
    status = h.kube.get("agentbudgets", "", "two")["status"]  # type: ignore[index]
    assert status["inUse"] == 1 and status["reservedRequests"] == 1
    assert status["availableRequests"] == 1 and status["availableConcurrency"] == 4
    assert status["window"]["bucketSeconds"] == 5
    h.delete_task("a")
    await h.advance(3)
    status = h.kube.get("agentbudgets", "", "two")["status"]  # type: ignore[index]
    assert status["inUse"] == 0 and status["usedRequests"] == 1
    assert sum(b["requests"] for b in status["window"]["buckets"]) == 1
    writes = h.kube.writes["agentbudgets/status PATCH"]
    await h.advance(3)
    assert h.kube.writes["agentbudgets/status PATCH"] == writes  # nothing changed


@run
async def test_a_restart_restores_from_the_window_what_no_task_shows() -> None:
    h = Harness()
    await pool(h)
    h.budget(budget("one").requests_per_minute(1))
    h.task(budgeted("gone", "one"))
    h.task(budgeted("next", "one").set("metadata.creationTimestamp", "2099-01-01T00:00:00Z"))
    await h.settle()
    h.delete_task("gone")  # a person deletes it: only the window remembers its request
    await h.advance(3)
    await h.advance(3)
    restarted(h)
    await h.advance(30)
    assert assigned(h) == set()  # the minute is still spent
    await h.advance(40)
    assert assigned(h) == {"next"}


# -- what agents report on their claim's Lease ---------------------------------------------


def state(h: Harness, name: str) -> Any:
    return h.controller.cores.budgets.book.state(name, h.clock.monotonic())


@run
async def test_a_throttle_on_a_lease_pauses_the_budget_for_everyone_once() -> None:
    h = Harness()
    await pool(h)
    h.budget(budget("p"))  # no limit: only its throttles gate it
    h.task(budgeted("a", "p"))
    await h.settle()
    h.renew("a")
    throttle = json.dumps({"budget": "p", "retryAfterSeconds": 10, "id": "429-1"})
    h.annotate_lease("a", "agentq.dev/throttled", throttle)
    await h.settle()
    h.task(budgeted("b", "p"))
    await h.advance(9)
    h.renew("a")  # the same report seen again: not applied twice
    await h.advance(0.5)
    assert "b" not in assigned(h)
    await h.advance(1)
    assert "b" in assigned(h)
    assert state(h, "p").throttled_until is not None


@run
async def test_a_throttle_is_applied_once_however_long_its_attempt_runs() -> None:
    # The id is remembered for as long as the attempt holds its grant: a Lease renewed an
    # hour later still carries the report, and it must not pause the budget again.
    h = Harness()
    await pool(h)
    h.budget(budget("p"))
    h.task(budgeted("a", "p").lease(7200))
    await h.settle()
    h.renew("a")
    throttle = json.dumps({"budget": "p", "retryAfterSeconds": 10, "id": "1-0123456789abcdef"})
    h.annotate_lease("a", "agentq.dev/throttled", throttle)
    await h.settle()
    await h.advance(3700)
    h.renew("a")
    await h.settle()
    h.task(budgeted("b", "p"))
    await h.settle()
    assert "b" in assigned(h)


@run
async def test_a_throttle_that_is_not_a_sidecars_is_ignored() -> None:
    h = Harness()
    await pool(h)
    h.budget(budget("p"))
    h.task(budgeted("a", "p"))
    await h.settle()
    h.renew("a")
    for bad in (
        {"budget": "p", "retryAfterSeconds": 10, "id": ""},  # no id: could not be applied once
        {"budget": "p", "retryAfterSeconds": 10, "id": "x", "by": "me"},  # unknown field
        {"budget": "p", "retryAfterSeconds": 3601, "id": "y"},  # beyond an hour
        {"budget": "other", "retryAfterSeconds": 10, "id": "z"},  # not its task's budget
    ):
        h.annotate_lease("a", "agentq.dev/throttled", json.dumps(bad))
        await h.settle()
    h.task(budgeted("b", "p"))
    await h.settle()
    assert "b" in assigned(h)


def corrected(resource: str, direction: str) -> float:
    from prometheus_client import REGISTRY

    labels = {"budget": "t", "resource": resource, "direction": direction}
    return REGISTRY.get_sample_value("agentq_budget_corrections_total", labels) or 0.0


@run
async def test_reported_usage_corrects_the_grant_and_a_final_report_ends_it() -> None:
    extra, refund = corrected("tokens", "extra"), corrected("requests", "refund")
    h = Harness()
    await pool(h)
    h.budget(budget("t").tokens_per_minute(6000))
    h.task(task("a").requires("llm").budget("t", tokens=1000, requests=5))
    await h.settle()
    h.renew("a")
    h.annotate_lease("a", "agentq.dev/usage", json.dumps({"t": {"requests": 1, "tokens": 3000}}))
    await h.settle()
    now = state(h, "t")
    assert (now.used.tokens, now.reserved.tokens) == (3000, 0)  # above its estimate
    assert (now.used.requests, now.reserved.requests) == (1, 4)
    h.report("a", outcome="Succeeded", result={}, usage={"t": {"requests": 2, "tokens": 3500}})
    await h.settle()
    end = state(h, "t")
    assert (end.used.requests, end.used.tokens) == (2, 3500)  # its last word, not 5
    assert end.reserved.requests == 0 and end.in_use == 0
    assert corrected("tokens", "extra") - extra == 2500  # 3,500 spent of an estimate of 1,000
    assert corrected("requests", "refund") - refund == 3  # 2 spent of an estimate of 5


@run
async def test_usage_that_does_not_fit_is_ignored() -> None:
    h = Harness()
    await pool(h)
    h.budget(budget("t").tokens_per_minute(6000))
    h.task(task("a").requires("llm").budget("t", tokens=1000))
    await h.settle()
    h.renew("a")
    for bad in (
        "not json",
        '{"t": {"tokens": -5}}',
        '{"t": {"tokens": 1.5}}',
        '["t"]',
        '{"t": {"tokens": 3000, "cost": 1}}',  # not what a sidecar writes: none of it read
    ):
        h.annotate_lease("a", "agentq.dev/usage", bad)
        await h.settle()
    assert (state(h, "t").used.tokens, state(h, "t").reserved.tokens) == (0, 1000)


@run
async def test_the_end_of_an_attempt_carries_what_it_was_accounted() -> None:
    h = Harness()
    await pool(h)
    h.budget(budget("t").tokens_per_minute(6000))
    h.task(task("a").requires("llm").budget("t", tokens=1000, requests=2))
    h.task(task("plain").requires("llm"))
    await h.settle()
    h.renew("a")
    h.annotate_lease("a", "agentq.dev/usage", json.dumps({"t": {"requests": 1, "tokens": 3000}}))
    await h.settle()
    h.report("a", outcome="Failed", error={"reason": "Flaky", "retryable": True})
    await h.settle()
    first = h.status("a")["history"][0]
    assert first["usage"] == [{"name": "t", "requests": 2, "tokens": 3000}]  # max(E, U)
    h.renew("plain")
    await h.settle()
    h.report("plain", outcome="Succeeded", result={})
    await h.settle()
    assert "usage" not in h.status("plain")["history"][-1]


@run
async def test_the_budget_status_says_saturated_and_the_gauges_count_oversized_tasks() -> None:
    from prometheus_client import REGISTRY

    h = Harness()
    await one_slot(h)
    h.task(budgeted("huge", "one", requests=10))  # fine: "one" has no per-minute limit
    h.budget(budget("small").requests_per_minute(5))
    h.task(budgeted("big", "small", requests=10))
    await h.advance(3)
    status = h.kube.get("agentbudgets", "", "one")["status"]  # type: ignore[index]
    conds = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conds == {"Saturated": ("True", "MaxConcurrent"), "Throttled": ("False", "NotThrottled")}
    since = status["conditions"][0]["lastTransitionTime"]
    await h.advance(3)
    status = h.kube.get("agentbudgets", "", "one")["status"]  # type: ignore[index]
    assert status["conditions"][0]["lastTransitionTime"] == since  # kept while it stays
    assert REGISTRY.get_sample_value("agentq_budget_oversized_tasks", {"budget": "small"}) == 1
    assert REGISTRY.get_sample_value("agentq_budget_waiting_tasks", {"budget": "one"}) == 2
    small = h.kube.get("agentbudgets", "", "small")["status"]  # type: ignore[index]
    assert small["waiting"] == 0  # a task it can never admit does not wait for it


@run
async def test_a_budget_that_is_the_bottleneck_is_shared_by_queue_weights() -> None:
    """issue 21 item 5: one grant a second (requestsPerMinute 60) for two backlogged
    queues of weights 1:3 on a pool with room for all: the budget's grants go 1:3, within
    the queue level's DRR bound (one task's cost) at every prefix of the grant order."""
    from builders import queue

    h = Harness()
    h.namespace(NS, team="a")
    await pool(h)
    h.queue(queue("light").selects(team="a").workers_in(NS).weight(1))
    h.queue(queue("heavy").selects(team="a").workers_in(NS).weight(3))
    h.budget(budget("openai").requests_per_minute(60))
    for i in range(40):
        for q in ("light", "heavy"):
            h.task(budgeted(f"{q}-{i:02d}", "openai").queue(q).lease(3600))
    await h.settle()
    order: list[str] = sorted(assigned(h))
    for _ in range(160):
        if len(order) >= 40:
            break
        await h.advance(0.5)
        new = assigned(h) - set(order)
        assert len(new) <= 1, new  # the budget's pace: one a second
        order += sorted(new)
    assert len(order) >= 40
    order = order[:40]
    for n in range(1, len(order) + 1):
        light = sum(1 for name in order[:n] if name.startswith("light"))
        heavy = n - light
        assert abs(heavy - 3 * light) <= 4, (n, light, heavy)  # (1 + 3) x one task's cost
    assert sum(1 for name in order if name.startswith("light")) in (9, 10, 11)
