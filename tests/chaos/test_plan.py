"""The chaos plan is a pure function of its seed, and a plan the run can assert on."""

from __future__ import annotations

import pytest

from chaos import plan as p


@pytest.mark.parametrize("profile", sorted(p.PROFILES))
def test_the_same_seed_gives_the_same_plan(profile: str) -> None:
    assert p.make_plan(7, profile) == p.make_plan(7, profile)
    assert p.make_plan(7, profile) != p.make_plan(8, profile)


@pytest.mark.parametrize("profile", sorted(p.PROFILES))
def test_every_fault_of_the_profile_fires_in_order_before_the_end(profile: str) -> None:
    plan = p.make_plan(11, profile)
    wanted = dict(p.PROFILES[profile].faults)
    if p.PROFILES[profile].clock_correction:
        wanted[p.CLOCK_STEP] += 1
    assert {k: sum(1 for f in plan.faults if f.kind == k) for k in wanted} == wanted
    points = [f.at for f in plan.faults]
    assert points == sorted(points)
    assert all(0.05 <= at <= 0.9 for at in points)
    step = next(f for f in plan.faults if f.kind == p.CLOCK_STEP)
    assert step.target == "leader" and step.seconds == 7200
    if p.PROFILES[profile].clock_correction:
        correction = plan.faults[-1] if plan.faults[-1].kind == p.CLOCK_STEP else None
        later = [f for f in plan.faults if f.kind == p.CLOCK_STEP and f.at > step.at]
        assert later and later[0].target == "stepped" and later[0].seconds == 0
        assert correction is None or correction.target == "stepped"


def test_agent_faults_name_workers_and_stops_straddle_the_lease() -> None:
    plan = p.make_plan(3, "full")
    names = {w.name for w in plan.workers}
    agent_faults = [f for f in plan.faults if f.kind in p.AGENT_FAULTS]
    assert {f.target for f in agent_faults} <= names
    stops = [f.seconds for f in plan.faults if f.kind in (p.AGENT_STOP, p.SIDECAR_STOP)]
    lease = p.PROFILES["full"].lease_seconds
    assert min(stops) < lease < max(stops)  # a short stop must cost nothing, a long one may
    leader_stops = [f.seconds for f in plan.faults if f.kind == p.LEADER_STOP]
    assert all(s > 4 for s in leader_stops)  # longer than the election lease


@pytest.mark.parametrize("seed", range(20))
def test_the_poison_set_can_only_reach_failing_agents(seed: int) -> None:
    plan = p.make_plan(seed, "short")
    poison_workers = [w for w in plan.workers if w.poison]
    normal_workers = [w for w in plan.workers if not w.poison]
    assert poison_workers and normal_workers
    for t in plan.tasks:
        takers = [w for w in plan.workers if set(t.requires) <= set(w.capabilities)]
        assert takers, f"{t.name} {t.requires} has no worker"
        assert all(w.poison == t.poison for w in takers), (t, takers)
    assert len(plan.poison_set) == p.PROFILES["short"].poison_tasks
    assert all(t.max_reclaims == 2 for t in plan.tasks if t.poison)


def test_a_task_count_override_scales_the_poison_set() -> None:
    plan = p.make_plan(5, "full", tasks=200)
    assert len(plan.tasks) == 200
    assert len(plan.poison_set) == 6
    assert len(plan.workers) == 20


@pytest.mark.parametrize("profile", sorted(p.PROFILES))
def test_a_third_of_the_normal_tasks_name_the_runs_budget(profile: str) -> None:
    plan = p.make_plan(13, profile)
    named = [t for t in plan.tasks if t.budget]
    assert all(t.budget == p.BUDGET and not t.poison for t in named)
    normal = sum(1 for t in plan.tasks if not t.poison)
    assert normal / 4 < len(named) < normal / 2
    assert plan.budget_max_concurrent == p.PROFILES[profile].budget_max_concurrent
