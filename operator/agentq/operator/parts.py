"""The operator's parts, wired: each built from the collaborators it uses, none from the
controller (docs/architecture.md draws them)."""

from __future__ import annotations

import random
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from agentq import claims
from agentq.clock import Clock
from agentq.operator.blind import BlindTime
from agentq.operator.budget_status import BudgetStatuses
from agentq.operator.cleanup import Cleanup
from agentq.operator.commit import Committer
from agentq.operator.config import OperatorConfig
from agentq.operator.confirm import ExpiryConfirmer
from agentq.operator.cores import Cores
from agentq.operator.decide import Decider
from agentq.operator.dispatch import Dispatcher
from agentq.operator.events import EventSink
from agentq.operator.follow import Follower
from agentq.operator.gate import RequestGate
from agentq.operator.health import WatchHealth
from agentq.operator.indexes import Indexes
from agentq.operator.leases import ClaimLeases
from agentq.operator.port import Kube
from agentq.operator.publish import Publisher
from agentq.operator.queue_status import QueueStatuses
from agentq.operator.readiness import WorkerReadiness
from agentq.operator.slots import Slots
from agentq.operator.store import Store
from agentq.operator.tokens import TokenAllocator
from agentq.operator.work import Agenda, Retries, Stats

__all__ = ["Parts", "wire"]


@dataclass
class Parts:
    store: Store
    agenda: Agenda
    indexes: Indexes
    cores: Cores
    retries: Retries
    blind: BlindTime
    slots: Slots
    gate: RequestGate
    events: EventSink
    tokens: TokenAllocator
    publisher: Publisher
    queue_statuses: QueueStatuses
    budget_statuses: BudgetStatuses
    readiness: WorkerReadiness
    confirmer: ExpiryConfirmer
    leases: ClaimLeases
    committer: Committer
    decider: Decider
    dispatcher: Dispatcher
    cleanup: Cleanup
    follower: Follower


def wire(
    *,
    kube: Kube,
    clock: Clock,
    config: OperatorConfig,
    rng: random.Random,
    health: WatchHealth,
    events: EventSink | None,
    tokens: TokenAllocator | None,
    stats: Stats,
    poke: Callable[[], None],
    may_send: Callable[[], bool],
    remaining: Callable[[], float],
    epoch: Callable[[], int | None],
    epoch_refused: Callable[[int], None] = lambda floor: None,
) -> Parts:
    """Every part, from the port, the clock and the settings. ``poke`` wakes the loop;
    ``may_send``: whether a decision made may still go out (leadership); ``remaining``:
    how long the leader may still act (s); ``epoch``: the leader's epoch, which grants
    carry (None without leader election)."""
    store = Store()
    store.watched = tuple(config.namespaces)
    agenda = Agenda(poke)
    indexes = Indexes(timers=agenda.timers, clock=clock, store=store)
    cores = Cores(store, indexes.claims, clock)
    retries = Retries(store, agenda, clock)
    # Time the operator could not watch is given back to every Lease.
    blind = BlindTime(
        store=store,
        clock=clock,
        stats=stats,
        stall_seconds=config.stall_seconds,
        silence_seconds=config.api_silence_seconds,
    )
    # -- API requests: decisions first, then Events and tidying up
    slots = Slots(config.write_concurrency, clock=clock)
    gate = RequestGate(
        slots,
        may_send=may_send,
        on_done=poke,
        timeout=config.request_seconds,
        remaining=remaining,
    )
    events = events or EventSink(kube, clock, component="agentq-operator", slots=slots)
    tokens = tokens or TokenAllocator(
        kube,
        clock,
        namespace=config.leader_namespace,
        name=config.token_lease,
        block=config.token_block,
    )
    # -- the parts
    cleanup = Cleanup(
        gate=gate,
        kube=kube,
        clock=clock,
        stats=stats,
        default_ttl=float(config.ttl_after_finished),
        limit=config.max_finished,
    )
    publisher = Publisher(
        store=store,
        indexes=indexes,
        cores=cores,
        agenda=agenda,
        gate=gate,
        kube=kube,
        clock=clock,
        config=config,
        stats=stats,
        finished=cleanup.phases,
    )
    queue_statuses = QueueStatuses(
        store=store,
        indexes=indexes,
        agenda=agenda,
        gate=gate,
        kube=kube,
        clock=clock,
        config=config,
        stats=stats,
    )
    budget_statuses = BudgetStatuses(
        store=store,
        indexes=indexes,
        cores=cores,
        agenda=agenda,
        gate=gate,
        kube=kube,
        clock=clock,
        interval=config.budget_status_interval,
    )
    readiness = WorkerReadiness(
        store=store,
        cores=cores,
        agenda=agenda,
        gate=gate,
        kube=kube,
        clock=clock,
        publisher=publisher,
        redecide=agenda.dirty.update,
    )
    confirmer = ExpiryConfirmer(gate=gate, kube=kube, cores=cores, stats=stats)
    leases = ClaimLeases(
        store=store,
        agenda=agenda,
        gate=gate,
        kube=kube,
        clock=clock,
        retries=retries,
        stats=stats,
    )
    committer = Committer(
        store=store,
        agenda=agenda,
        gate=gate,
        kube=kube,
        events=events,
        clock=clock,
        confirmer=confirmer,
        readiness=readiness,
        leases=leases,
        retries=retries,
        stats=stats,
        credits=lambda: blind.credits,
        accounted=cores.budgets.accounted,
    )
    decider = Decider(
        store=store,
        indexes=indexes,
        agenda=agenda,
        gate=gate,
        committer=committer,
        health=health,
        clock=clock,
        rng=rng,
        policy=claims.Policy(
            max_reclaims=config.max_reclaims,
            progress_interval=config.progress_status_interval,
        ),
        stats=stats,
        write_concurrency=config.write_concurrency,
        credits=lambda: blind.credits,
        token_ceiling=lambda: tokens.issued,
    )
    dispatcher = Dispatcher(
        store=store,
        indexes=indexes,
        cores=cores,
        tokens=tokens,
        gate=gate,
        committer=committer,
        leases=leases,
        retries=retries,
        publisher=publisher,
        agenda=agenda,
        clock=clock,
        stats=stats,
        batch=config.dispatch_batch,
        epoch=epoch,
        epoch_refused=epoch_refused,
        on_granted=queue_statuses.granted,
    )
    follower = Follower(
        store=store,
        indexes=indexes,
        cores=cores,
        agenda=agenda,
        readiness=readiness,
        publisher=publisher,
        queue_statuses=queue_statuses,
        decider=decider,
        tokens=tokens,
        cleanup=cleanup,
        delete_lease=lambda key, lease: _spawn(gate, leases.delete(key, lease)),
        check_orphan=lambda key, lease: _spawn(gate, leases.check_orphan(key, lease)),
    )
    return Parts(
        store=store,
        agenda=agenda,
        indexes=indexes,
        cores=cores,
        retries=retries,
        blind=blind,
        slots=slots,
        gate=gate,
        events=events,
        tokens=tokens,
        publisher=publisher,
        queue_statuses=queue_statuses,
        budget_statuses=budget_statuses,
        readiness=readiness,
        confirmer=confirmer,
        leases=leases,
        committer=committer,
        decider=decider,
        dispatcher=dispatcher,
        cleanup=cleanup,
        follower=follower,
    )


def _spawn(gate: RequestGate, coro: Coroutine[Any, Any, Any]) -> None:
    gate.spawn(coro)
