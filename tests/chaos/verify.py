"""The end-of-run verdict: what the API server, the agents and the sink say, checked.

Pure: ``verify`` takes what the harness collected (final tasks and events read
from the API server, the watch's observations, the fault log, the agents'
reports, the sink) and returns the figures and every violation found.

Healthy claim (the definition the run asserts on): a claim is one grant — a
task, a fencing token, a worker. It is *healthy* when no process of its worker's
agent pod (the agent, the sidecar) was faulted — SIGKILLed, SIGSTOPped, or exited
on its own — at any moment from one second before the watch first saw the claim
active until one second after the watch saw it end (a killed process counts as
faulted until a few seconds after its replacement started). Operator-side faults
(leader killed, stopped, terminated; API server restarted; a wall-clock step) do
not make a claim unfaulted or faulted: surviving them is the point. A healthy
claim is *reclaimed* when its attempt's history entry says the operator ended it
(outcome Failed for any reason other than one the agent itself reports, e.g.
LeaseExpired, ProgressDeadlineExceeded). ``healthy reclaimed`` must be 0.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from chaos.agents import SinkRow
from chaos.observe import FINAL, Observations
from chaos.plan import AGENT_FAULTS, BUDGET, LEADER_KILL, LEADER_STOP, LEADER_TERM, Plan

LEADER_FAULTS = (LEADER_KILL, LEADER_TERM, LEADER_STOP)
MARGIN = 1.0  # seconds around a claim's observed life, for the watch's latency


@dataclass
class FaultRecord:
    kind: str
    target: str  # a worker, a replica, kube-apiserver
    at: float  # harness seconds
    until: float | None = None  # end of the faulted interval (agent faults), None = open
    note: str = ""


@dataclass
class Collected:
    plan: Plan
    kit: str
    reported_reasons: frozenset[str]
    tasks: list[dict[str, Any]]
    events: list[dict[str, Any]]
    seen: Observations
    faults: list[FaultRecord]
    reports: dict[str, set[tuple[str, int]]]
    sink: dict[str, list[SinkRow]] | None
    duration: float
    end: float
    refused_by_sink: int = 0
    operator_errors: int = 0
    operator_tracebacks: int = 0
    invariant_checks: int = 0  # at least (each replica process says every 100th)
    invariant_violations: int = 0
    leader_acquisitions: int = 0
    skipped: list[str] = field(default_factory=list)
    load: tuple[float, ...] = ()


@dataclass
class Verdict:
    figures: dict[str, Any]
    violations: list[str]
    liveness: list[str]  # healthy claims reclaimed (the liveness assertion)

    @property
    def safe(self) -> bool:
        return not self.violations

    @property
    def ok(self) -> bool:
        return not self.violations and not self.liveness


def _history(task: dict[str, Any]) -> list[dict[str, Any]]:
    return list((task.get("status") or {}).get("history") or [])


def _faulted(intervals: list[tuple[float, float]], start: float, end: float) -> bool:
    return any(a <= end + MARGIN and b >= start - MARGIN for a, b in intervals)


def verify(c: Collected) -> Verdict:
    plan = c.plan
    violations: list[str] = list(c.seen.violations)
    by_name = {t["metadata"]["name"]: t for t in c.tasks}
    planned = {t.name for t in plan.tasks}
    phases: Counter[str] = Counter()
    lost = sorted(planned - set(by_name))
    for name in lost:
        violations.append(f"lost: {name} no longer exists")
    unfinished = []
    for name in sorted(planned & set(by_name)):
        status = by_name[name].get("status") or {}
        phase = status.get("phase") or "(none)"
        phases[phase] += 1
        if phase not in FINAL:
            waits = f" notBefore {status['notBefore']}" if status.get("notBefore") else ""
            unfinished.append(f"{name}={phase}{waits}")
    if unfinished:
        violations.append(f"not terminal: {len(unfinished)} tasks, e.g. {unfinished[:10]}")
    if c.invariant_violations:
        violations.append(
            f"invariants: {c.invariant_violations} differences between the operator's "
            "indexes and its store (see 'invariant violated' in the replica logs)"
        )
    extra = sorted(set(by_name) - planned)
    if extra:
        violations.append(f"tasks nobody created: {extra[:10]}")

    # DeadLettered == the poison set, and nothing else failed.
    dead = {n for n, t in by_name.items() if (t.get("status") or {}).get("phase") == "DeadLettered"}
    poison = plan.poison_set
    if dead != poison:
        violations.append(
            f"DeadLettered != poison set: missing {sorted(poison - dead)[:10]}, "
            f"unexpected {sorted(dead - poison)[:10]}"
        )
    failed = sorted(
        n for n, t in by_name.items() if (t.get("status") or {}).get("phase") == "Failed"
    )
    if failed:
        violations.append(f"Failed (no agent fails fatally in this run): {failed[:10]}")

    # Committed once, from the final token, by the agent that held it.
    committed_twice = []
    wrong_result = []
    succeeded_events: Counter[str] = Counter(
        e["involvedObject"]["name"] for e in c.events if e.get("reason") == "Succeeded"
    )
    for name, task in by_name.items():
        status = task.get("status") or {}
        wins = [h for h in _history(task) if h.get("outcome") == "Succeeded"]
        if len(wins) > 1 or succeeded_events[name] > 1:
            committed_twice.append(name)
        if status.get("phase") != "Succeeded":
            if wins:
                wrong_result.append(
                    f"{name}: a Succeeded history entry but phase {status.get('phase')}"
                )
            continue
        token = status.get("fencingToken")
        if not wins or wins[-1].get("token") != token:
            wrong_result.append(f"{name}: the Succeeded entry's token is not the final {token}")
            continue
        if (status.get("worker"), token) not in c.reports.get(name, set()):
            wrong_result.append(
                f"{name}: no report by {status.get('worker')} with token {token} "
                f"(reports: {sorted(c.reports.get(name, set()))})"
            )
        if c.sink is not None:
            rows = c.sink.get(name, [])
            data = rows[0].data if len(rows) == 1 else None
            written = data.get("token") if isinstance(data, dict) else token
            if len(rows) != 1 or rows[0].token != token or written != token:
                wrong_result.append(
                    f"{name}: the sink holds {[r.token for r in rows]}, "
                    f"not one write of token {token}"
                )
    if c.sink is not None:
        # A failed attempt may leave its output (agent-sim writes before it reports a
        # failure), but never under a token the operator did not issue to the task.
        for name, rows in c.sink.items():
            final = (by_name.get(name, {}).get("status") or {}).get("fencingToken") or 0
            if any(r.token > final for r in rows):
                wrong_result.append(f"{name}: the sink holds token {rows[0].token} > final {final}")
    violations += [f"committed twice: {n}" for n in sorted(committed_twice)]
    violations += [f"result: {w}" for w in wrong_result]

    # maxInFlight: checked on every watched state; the peak ratio is reported.
    limits = {w.name: w.max_in_flight for w in plan.workers}
    peak = max((c.seen.peak_in_flight[w] / limits[w] for w in limits), default=0.0)
    # maxConcurrent of the run's AgentBudget: checked on every watched state too; and the
    # leader faults that hit while the budget's claims were held (what a new leader must
    # count from the task statuses).
    budget_peak = c.seen.peak_budget_in_use[BUDGET] / plan.budget_max_concurrent
    budgeted = {t.name for t in plan.tasks if t.budget}
    held_at_failover = sum(
        1
        for f in c.faults
        if f.kind in LEADER_FAULTS
        and any(
            claim.task in budgeted
            and claim.first_seen <= f.at <= (claim.ended_seen if claim.ended_seen else c.end)
            for claim in c.seen.claims.values()
        )
    )

    # Claims and the healthy ones.
    intervals: dict[str, list[tuple[float, float]]] = {w.name: [] for w in plan.workers}
    for f in c.faults:
        if f.kind in AGENT_FAULTS or f.kind == "agent-crash":
            intervals.setdefault(f.target, []).append(
                (f.at, f.until if f.until is not None else c.end)
            )
    claims = 0
    unobserved = 0
    faulted = 0
    healthy = 0
    reclaims: Counter[str] = Counter()
    healthy_reclaimed: list[str] = []
    never_faulted = {w for w, spans in intervals.items() if not spans}
    pristine = pristine_reclaimed = 0  # claims of workers never faulted at all in the run
    for name, task in by_name.items():
        for entry in _history(task):
            token, worker = entry.get("token"), entry.get("worker")
            if entry.get("outcome") not in ("Succeeded", "Failed", "Held") or token is None:
                continue
            claims += 1
            reclaimed = entry.get("outcome") == "Held" or (
                entry.get("outcome") == "Failed" and entry.get("reason") not in c.reported_reasons
            )
            if reclaimed:
                reclaims[str(entry.get("reason"))] += 1
            seen = c.seen.claims.get((name, int(token)))
            if seen is None:
                unobserved += 1
                continue
            end = seen.ended_seen if seen.ended_seen is not None else c.end
            if _faulted(intervals.get(str(worker), []), seen.first_seen, end):
                faulted += 1
                continue
            healthy += 1
            if worker in never_faulted:
                pristine += 1
                pristine_reclaimed += int(reclaimed)
            if reclaimed:
                healthy_reclaimed.append(
                    f"{name} token {token} on {worker} ({entry.get('reason')}), "
                    f"seen active {seen.first_seen:.1f}s-{end:.1f}s"
                )

    faults = Counter(f.kind for f in c.faults)
    figures: dict[str, Any] = {
        "seed": plan.seed,
        "profile": plan.profile,
        "agents": c.kit,
        "tasks": len(plan.tasks),
        "workers": len(plan.workers),
        "poison tasks": len(poison),
        "duration (s)": round(c.duration, 1),
        "load average (start, end)": ", ".join(f"{x:.1f}" for x in c.load) or "-",
        "Succeeded": phases.get("Succeeded", 0),
        "DeadLettered": phases.get("DeadLettered", 0),
        "Failed": phases.get("Failed", 0),
        "not terminal": len(unfinished),
        "lost": len(lost),
        "committed twice": len(committed_twice),
        "result not from the final token": len(wrong_result),
        "DeadLettered == poison set": dead == poison,
        "sink checked": c.sink is not None,
        "stale writes refused by the sink": c.refused_by_sink,
        "states checked (maxInFlight)": c.seen.states_checked,
        "maxInFlight exceeded": sum(1 for v in c.seen.violations if v.startswith("maxInFlight")),
        "peak in-flight / maxInFlight": round(peak, 2),
        "tasks naming the AgentBudget": sum(1 for t in plan.tasks if t.budget),
        "maxConcurrent exceeded": sum(
            1 for v in c.seen.violations if v.startswith("maxConcurrent")
        ),
        "peak claims / maxConcurrent": round(budget_peak, 2),
        "leader faults with AgentBudget claims held": held_at_failover,
        "claims": claims,
        "claims faulted": faulted,
        "claims unobserved": unobserved,
        "claims healthy": healthy,
        "healthy claims reclaimed": len(healthy_reclaimed),
        "claims of never-faulted workers (reclaimed)": f"{pristine} ({pristine_reclaimed})",
        "reclaims by reason": dict(sorted(reclaims.items())),
        "faults injected": dict(sorted(faults.items())),
        "watch gaps": len(c.seen.gaps),
        "leader acquisitions": c.leader_acquisitions,
        "operator ERROR lines": c.operator_errors,
        "operator tracebacks": c.operator_tracebacks,
        "invariant checks (at least)": c.invariant_checks,
        "invariant violations": c.invariant_violations,
    }
    if c.skipped:
        figures["skipped"] = c.skipped
    return Verdict(figures=figures, violations=violations, liveness=healthy_reclaimed)
