"""``check``: every index built afresh from the store's records, compared with the live one.

A lost wake-up -- a task nobody will look at again, a worker whose Lease goes
stale unnoticed, a pending task off the queue for good -- is a difference
between what the records say and what the indexes and timers hold. The unit
harness runs this after every step (a difference fails the test), the chaos run
after it ends, and the operator every ``INVARIANT_INTERVAL`` and at each resync
(``agentq_invariant_violations_total{index}``, and a log line naming the object).

It is written apart from the code it checks (``indexes``, ``cores``, the
parts' timers), from the records and the pure rules alone. It runs after a
step: every change is applied and every timer due at the step's ``now`` has
fired; what the step computed it computed at some time between ``now`` and
``later`` (the clock as the check runs), and either answer is right in between.

Claims across namespaces (docs/tenancy.md) are judged the same way: a pending
task's lane and member id (``queue_member``), a worker's claims by its
namespace with claim ids, each core's load by the namespace of the worker
that holds it, ``Cores.loaded``, and ``Store.xleases`` against the Lease
records.

Pure: no I/O; reads only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime

from agentq import claims, protocol
from agentq.claims import Readiness
from agentq.operator import budgeting
from agentq.operator.cores import Cores, core_spec, holder_namespace, wanted_holder
from agentq.operator.indexes import (
    Indexes,
    claim_holder,
    grantable_from,
    phase_name,
    queue_member,
    verdict_of,
)
from agentq.operator.readiness import DIAGNOSE_SECONDS
from agentq.operator.records import TaskRecord
from agentq.operator.store import Store
from agentq.operator.tenants import IMPLICIT_PREFIX, topology
from agentq.operator.work import TIMER_BACKOFF, TIMER_PUBLISH, TIMER_TASK, TIMER_WORKER, Agenda
from agentq.views import Key

__all__ = ["Violation", "check"]


@dataclass(frozen=True)
class Violation:
    index: str  # which index (queue, claims, phases, coverage, cores, readiness, timers, ...)
    subject: str  # the object it is about, namespace/name
    message: str

    def __str__(self) -> str:
        return f"{self.index}: {self.subject}: {self.message}"


def _name(key: Key) -> str:
    return f"{key[0]}/{key[1]}"


def check(
    *,
    store: Store,
    indexes: Indexes,
    cores: Cores,
    agenda: Agenda,
    publishing: Collection[Key],
    next_deadline: Callable[[TaskRecord, float], float | None],
    healthy: bool,
    now: float,
    later: float,
    wall: datetime,
) -> list[Violation]:
    """Every difference between the indexes and what the records say (see above)."""
    out: list[Violation] = []
    if store.changed:
        keys = [*store.changed.tasks, *store.changed.workers, *store.changed.leases]
        first = _name(keys[0]) if keys else "AgentQueues"
        out.append(Violation("changes", first, f"{len(keys)} change(s) not applied"))
    out += _queue(store, indexes, agenda, now, later, wall)
    out += _task_indexes(store, indexes)
    out += _xleases(store)
    out += _coverage(store, indexes)
    out += _cores(store, cores)
    out += _budget_grants(store, cores)
    out += _queue_level(indexes, cores)
    out += _readiness(store, agenda, now, later)
    out += _task_timers(store, agenda, next_deadline, healthy, later)
    out += _publish(store, agenda, publishing)
    out += _writes(store)
    return out


def _queue(
    store: Store, indexes: Indexes, agenda: Agenda, now: float, later: float, wall: datetime
) -> list[Violation]:
    out: list[Violation] = []
    live = {key: (required, queued, lane) for key, lane, required, queued in indexes.queue.items()}
    topo = topology(store.queues)
    if topo != indexes.topology:
        out.append(Violation("tenancy", "-", "the queue tree differs from the AgentQueues'"))
    held = dict(indexes.held)
    budget_held = dict(indexes.budget_held)
    claims_of: Counter[str] = Counter()
    pending_of: Counter[str] = Counter()
    for key, record in store.tasks.items():
        view = record.view
        if view.active and view.spec.queue is not None:
            claims_of[view.spec.queue] += 1
        if view.pending and view.spec.queue is not None:
            pending_of[view.spec.queue] += 1
        member = view.pending and view.problem is None
        verdict = verdict_of(view, topo, store) if member else None
        if held.pop(key, None) != verdict:
            out.append(Violation("tenancy", _name(key), f"its verdict should be {verdict}"))
        member = member and verdict is None
        barred = budgeting.verdict_of(view, store) if member and view.spec.budgets else None
        if budget_held.pop(key, None) != barred:
            out.append(Violation("budgets", _name(key), f"its verdict should be {barred}"))
        member = member and barred is None
        place = queue_member(view, topo) if member else key
        shown = live.pop(place, None)
        if not member:
            if shown is not None:
                out.append(Violation("queue", _name(key), f"queued but {view.phase}"))
            continue
        required = view.spec.required_capabilities
        start = grantable_from(record, now=now, wall=wall, keep=False)
        if shown is None:
            out.append(Violation("queue", _name(key), "pending but not in the queue"))
            continue
        if shown[0] != required:
            out.append(Violation("queue", _name(key), f"queued under {sorted(shown[0])}"))
        if shown[2] != (place[0], view.spec.queue or ""):
            out.append(Violation("queue", _name(key), f"in the lane {shown[2]}"))
        if shown[1] and (start is None or start > later):
            out.append(Violation("queue", _name(key), "queued though it may not be granted"))
        if not shown[1] and start is not None and start <= now:
            out.append(Violation("queue", _name(key), "not queued though it may be granted"))
        if not shown[1] and start is not None and start > now:
            due = agenda.timers.due((TIMER_BACKOFF, key))
            if due is None or due > start:
                out.append(
                    Violation("timers", _name(key), f"nothing queues it at {start:.3f} ({due})")
                )
    for key in live:
        out.append(Violation("queue", _name(key), "in the queue but not in the store"))
    for key in held:
        out.append(Violation("tenancy", _name(key), "a verdict held for no pending task"))
    for key in budget_held:
        out.append(Violation("budgets", _name(key), "a verdict held for no pending task"))
    if +indexes.queue_claims != claims_of:
        out.append(
            Violation(
                "tenancy",
                "-",
                f"queue claims {dict(indexes.queue_claims)}, the statuses say {dict(claims_of)}",
            )
        )
    if +indexes.queue_pending != pending_of:
        out.append(
            Violation(
                "tenancy",
                "-",
                f"queue pending {dict(indexes.queue_pending)}, the tasks say {dict(pending_of)}",
            )
        )
    return out


def _budget_grants(store: Store, cores: Cores) -> list[Violation]:
    """The budget book holds a grant for every task naming budgets whose claim is held
    (or whose grant is in flight or in doubt), and for nothing else."""
    budgets = cores.budgets
    if not budgets.restored:
        return []  # a new leader restores the book before its first grant
    out: list[Violation] = []
    for key, record in store.tasks.items():
        holds = record.view.spec.budgets and wanted_holder(record) is not None
        if holds and key not in budgets.open:
            out.append(Violation("budgets", _name(key), "its claim holds no grant in the book"))
    for key in budgets.open:
        held = store.tasks.get(key)
        if held is None or wanted_holder(held) is None:
            out.append(Violation("budgets", _name(key), "the book holds a grant it has not"))
    if set(budgets.book.grants()) != {held.grant_id for held in budgets.open.values()}:
        out.append(Violation("budgets", "-", "the book's grants differ from the open ones"))
    return out


def _task_indexes(store: Store, indexes: Indexes) -> list[Violation]:
    out: list[Violation] = []
    phases: Counter[str] = Counter()
    claims_of: dict[Key, set[str]] = {}
    for key, record in store.tasks.items():
        phases[phase_name(record.view)] += 1
        holder = claim_holder(record.view)
        if holder is not None:
            claim = protocol.claim_id(key[0], key[1], holder[0])
            claims_of.setdefault(holder, set()).add(claim)
    live_phases = +indexes.phases  # without zero counts
    if live_phases != phases:
        out.append(Violation("phases", "-", f"counts {dict(live_phases)}, tasks {dict(phases)}"))
    live_claims = {holder: tasks for holder, tasks in indexes.claims.items() if tasks}
    for holder in set(claims_of) | set(live_claims):
        want, have = claims_of.get(holder, set()), live_claims.get(holder, set())
        if want != have:
            out.append(
                Violation(
                    "claims",
                    _name(holder),
                    f"holds {sorted(have)}, the statuses say {sorted(want)}",
                )
            )
    return out


def _coverage(store: Store, indexes: Indexes) -> list[Violation]:
    out: list[Violation] = []
    offered: dict[str, dict[Key, frozenset[str]]] = {}
    for key, record in store.workers.items():
        spec = record.view.spec
        offered.setdefault(key[0], {})[key] = spec.capabilities if spec else frozenset()
    if offered != indexes.offered:
        out.append(Violation("coverage", "-", "offered capabilities differ from the workers'"))
    for (namespace, required), missing in indexes.uncovered.items():
        want = claims.missing_capabilities(
            required, list(offered.get(namespace, {}).values()), namespace
        )
        if want != missing:
            out.append(
                Violation(
                    "coverage",
                    f"{namespace}/{','.join(sorted(required))}",
                    f"judged {missing!r}, is {want!r}",
                )
            )
    return out


def _xleases(store: Store) -> list[Violation]:
    """The index of claim Leases in other namespaces is the Lease records'."""
    want: dict[Key, set[Key]] = {}
    for key, lease in store.leases.items():
        if lease.view.task_namespace is not None and lease.view.kind == protocol.LEASE_KIND_TASK:
            want.setdefault(lease.view.task, set()).add(key)
    if want != store.xleases:
        return [Violation("leases", "-", f"xleases {store.xleases}, the Leases say {want}")]
    return []


def _cores(store: Store, cores: Cores) -> list[Violation]:
    out: list[Violation] = []
    namespaces = {key[0] for key in store.workers} | set(cores.by_namespace)
    # Each core's tasks: a task of its namespace by name, another's by its claim id.
    loads: dict[str, dict[str, TaskRecord]] = {}
    for (ns, name), record in store.tasks.items():
        where = holder_namespace(record)
        claim = name if where == ns else protocol.cross_claim_id(ns, name)
        loads.setdefault(where, {})[claim] = record
    for key, where in cores.loaded.items():
        core = cores.get(where)
        if where == key[0] or core is None or core.holder(protocol.cross_claim_id(*key)) is None:
            out.append(Violation("cores", _name(key), f"remembered loaded in {where}, is not"))
    for namespace in namespaces:
        core = cores.get(namespace)
        if core is None:
            out.append(Violation("cores", namespace, "no scheduling core"))
            continue
        wanted: dict[str, object] = {}
        for (ns, name), worker in store.workers.items():
            if ns == namespace:
                wanted[name] = core_spec(worker.view, worker.readiness)
        for name in core.workers():
            if wanted.get(name) is None:
                out.append(Violation("cores", f"{namespace}/{name}", "in the core, should not be"))
        for name, spec in wanted.items():
            if spec is None:
                continue
            if not core.has_worker(name):
                out.append(Violation("cores", f"{namespace}/{name}", "not in the core"))
            elif core.worker_spec(name) != spec:
                out.append(
                    Violation("cores", f"{namespace}/{name}", "its spec in the core differs")
                )
        holds = core.holds()
        for name, record in loads.get(namespace, {}).items():
            want = wanted_holder(record)
            if want is not None and not core.has_worker(want):
                want = None
            have = holds.pop(name, None)
            if want != have:
                out.append(
                    Violation("cores", f"{namespace}/{name}", f"loads {have}, should load {want}")
                )
        for name, holder in holds.items():
            out.append(Violation("cores", f"{namespace}/{name}", f"gone, still loads {holder}"))
    return out


def _queue_level(indexes: Indexes, cores: Cores) -> list[Violation]:
    """The queue level's tree holds every attached AgentQueue, with its parent and weight,
    and each one's count of tasks that may be granted now (its lane's)."""
    out: list[Violation] = []
    topo, level = indexes.topology, cores.queues
    tree = level.tree
    names = set(tree.queues())
    for name in topo.depth:
        if name not in names:
            out.append(Violation("tenancy", name, "an attached AgentQueue not in the tree"))
            continue
        pending = tree.queue_state(name).pending
        want = indexes.queue.queued_count(level.lane_of(name))
        if pending != want:
            out.append(Violation("tenancy", name, f"{pending} pending in the tree, {want} queued"))
    for name in names:
        if name not in topo.depth and not name.startswith(IMPLICIT_PREFIX):
            out.append(Violation("tenancy", name, "in the tree, not an attached AgentQueue"))
    return out


def _readiness(store: Store, agenda: Agenda, now: float, later: float) -> list[Violation]:
    out: list[Violation] = []
    for key, record in store.workers.items():
        lease = store.worker_lease(key)
        wants = []
        for at in (now, later):
            fresh = lease is not None and lease.seen.fresh(at, lease.view.duration or 0)
            suspect = record.suspect_since is not None and not (
                fresh and lease is not None and lease.seen.changed_at > record.suspect_since
            )
            wants.append(
                claims.readiness(
                    record.view,
                    lease.view if lease is not None else None,
                    fresh=fresh,
                    unlabelled=record.unlabelled,
                    suspect=suspect,
                )
            )
        want = wants[0]
        if record.readiness not in wants:
            shown = record.readiness[0].value if record.readiness else None
            out.append(Violation("readiness", _name(key), f"{shown}, should be {want[0].value}"))
        due = agenda.timers.due((TIMER_WORKER, key))
        if lease is not None and lease.seen.expires_at() > now:
            expires = lease.seen.expires_at()
            if due is None or due > expires:
                out.append(Violation("timers", _name(key), f"nothing notes it stale at {expires}"))
        if want[0] is Readiness.LEASE_MISSING:
            again = record.diagnosed_at + DIAGNOSE_SECONDS
            if due is None or due > max(again, now):
                out.append(Violation("timers", _name(key), "its missing Lease is read no more"))
    return out


def _task_timers(
    store: Store,
    agenda: Agenda,
    next_deadline: Callable[[TaskRecord, float], float | None],
    healthy: bool,
    now: float,
) -> list[Violation]:
    """Every claim is looked at again by itself: it is being written, or waits to be
    decided, or has a timer no later than its next deadline (or a pause it is in)."""
    out: list[Violation] = []
    if not healthy:
        return out  # expiry is not judged: the watches' recovery decides every claim
    for key, record in store.tasks.items():
        if not record.view.active or record.busy or key in agenda.dirty:
            continue
        if record.lost_race_at == record.view.resource_version:
            continue  # a write lost its race on this view: the newer one's event decides
        latest = now
        if store.lease_of(record.view) is not None:
            deadline = next_deadline(record, now)
            latest = max(latest, deadline if deadline is not None else now)
        for pause in (record.redecide_at, record.unwritable_until):
            if pause is not None:
                latest = max(latest, pause)
        due = agenda.timers.due((TIMER_TASK, key))
        if due is None or due > latest:
            out.append(
                Violation(
                    "timers",
                    _name(key),
                    f"{record.view.phase} claim next looked at {due}, needed by {latest:.3f}",
                )
            )
    return out


def _publish(store: Store, agenda: Agenda, publishing: Collection[Key]) -> list[Violation]:
    out: list[Violation] = []
    for key, record in store.workers.items():
        state = record.publish
        if state.due is None or state.writing or key in publishing:
            continue
        due = agenda.timers.due((TIMER_PUBLISH, key))
        if due is None or due > state.due:
            out.append(Violation("timers", _name(key), f"status due {state.due}, not written"))
    return out


def _writes(store: Store) -> list[Violation]:
    out: list[Violation] = []
    busy = 0
    for key, record in store.tasks.items():
        busy += record.busy
        if (record.waiting or record.granting is not None) and not record.busy:
            out.append(Violation("writes", _name(key), "waits for a write that is not out"))
    if busy != store.busy:
        out.append(Violation("writes", "-", f"{store.busy} writes counted, {busy} out"))
    return out
