"""Wires the operator together and runs it on one event loop: the watches (informers,
or kopf), the leader elector, the controller loop, the metrics endpoint -- and the
order in which they stop.

Shutdown (SIGTERM, SIGINT, or ``stop``): first stop deciding (send nothing new,
let the writes already sent finish, at most a request timeout), then release the
leader Lease so the standby takes over at its next retry, then stop the watches
and close the connections. The operator installs
its own signal handlers (after kopf's, in kopf mode: kopf's would stop the
watches first and leave the controller deciding on a frozen cache).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from agentq import GROUP, VERSION, kube, protocol
from agentq.clock import SystemClock
from agentq.models import BUDGET_PLURAL, QUEUE_PLURAL, TASK_PLURAL, WORKER_PLURAL
from agentq.operator import metrics
from agentq.operator.claim_api import ClaimServer
from agentq.operator.config import OperatorConfig
from agentq.operator.controller import Controller
from agentq.operator.health import WatchHealth
from agentq.operator.informer import Informer
from agentq.operator.leader import LeaderElector
from agentq.operator.port import Body, Kube
from agentq.operator.silence import ApiSilence, HeardKube, pulse
from agentq.operator.store import finished

log = logging.getLogger("agentq.operator")
LEASE_SELECTOR = "agentq.dev/lease in (task,worker)"
# After SIGTERM, how long the release of the leader Lease and the goodbyes may take.
SHUTDOWN_SECONDS = 10.0


def make_kube(config: OperatorConfig, kubeconfig: kube.KubeConfig) -> Kube:
    """The port the controller writes through. A seam for bench/ only: the comparison
    writer (the kubernetes sync client in threads, bench/threaded_operator.py) replaces it."""
    from agentq.operator.rest import RestKube

    return RestKube(
        kube.Client(kubeconfig, pool=config.write_concurrency + 4, timeout=config.request_seconds)
    )


def _informers(
    config: OperatorConfig,
    client: kube.Client,
    controller: Controller,
    health: WatchHealth,
    silence: ApiSilence,
) -> list[Informer]:
    namespaces: list[str | None] = list(config.namespaces) or [None]
    resources = [(TASK_PLURAL, None), (WORKER_PLURAL, None), ("leases", LEASE_SELECTOR)]
    informers: list[Informer] = []
    pending: set[tuple[str, str | None]] = set()
    healthy: dict[str, set[str | None]] = {plural: set() for plural, _ in resources}

    for plural, selector in resources:
        for namespace in namespaces:
            path = _collection(plural, namespace)
            pending.add((plural, namespace))

            def synced(plural: str = plural, namespace: str | None = namespace) -> None:
                pending.discard((plural, namespace))
                if not pending:
                    controller.set_synced()

            def health_of(
                ok: bool, plural: str = plural, namespace: str | None = namespace
            ) -> None:
                (healthy[plural].add if ok else healthy[plural].discard)(namespace)
                health.set(plural, len(healthy[plural]) == len(namespaces))

            informers.append(
                Informer(
                    client,
                    path=path,
                    plural=plural,
                    on_event=controller.observe,
                    on_synced=synced,
                    on_health=health_of,
                    label_selector=selector,
                    on_heard=silence.heard,
                    keep=unfinished if plural == TASK_PLURAL else None,
                )
            )
    # The first decisions wait for the cluster-scoped lists too (a task naming a queue
    # is not judged on an empty store).
    for plural in CLUSTER_PLURALS:
        pending.add((plural, None))

    def cluster_synced(plural: str) -> None:
        pending.discard((plural, None))
        if not pending:
            controller.set_synced()

    informers.extend(cluster_informers(client, controller, silence, cluster_synced))
    return informers


def cluster_informers(
    client: kube.Client,
    controller: Controller,
    silence: ApiSilence,
    on_synced: Callable[[str], None],
) -> list[Informer]:
    """Cluster-scoped, whatever namespaces are watched: the AgentQueues, the
    AgentBudgets, and the namespaces' labels the queues' namespaceSelectors read."""
    informers = []
    for plural in CLUSTER_PLURALS:
        informers.append(
            Informer(
                client,
                path=_collection(plural, None),
                plural=plural,
                on_event=controller.observe,
                on_synced=functools.partial(on_synced, plural),
                on_health=lambda ok: None,  # (no claim's expiry depends on them)
                on_heard=silence.heard,
                # Without the AgentQueue (AgentBudget) CRD -- an older install -- no task
                # can name a queue (a budget).
                optional=plural in (QUEUE_PLURAL, BUDGET_PLURAL),
            )
        )
    return informers


#: The cluster-scoped lists the first decisions wait for, besides the namespaced ones.
CLUSTER_PLURALS = (QUEUE_PLURAL, BUDGET_PLURAL, "namespaces")

KOPF_SYNCED = "kopf"  # kopf's watches of tasks, workers and Leases (kopfwatch.SyncSignal)


def all_synced(parts: list[str], then: Callable[[], None]) -> Callable[[str], None]:
    """A callback to call with each of ``parts`` as it syncs; calls ``then`` once all
    have (and never again)."""
    pending = set(parts)

    def synced(part: str) -> None:
        if not pending:
            return
        pending.discard(part)
        if not pending:
            then()

    return synced


def unfinished(body: Body) -> bool:
    """A task the controller keeps a record of (a finished one it does not: cleanup.py)."""
    return not finished(body)


async def run(config: OperatorConfig, stop: asyncio.Event | None = None) -> None:
    config.check()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    clock = SystemClock()
    kubeconfig = kube.load()
    silence = ApiSilence(clock, config.api_silence_seconds)
    port = HeardKube(make_kube(config, kubeconfig), silence)
    informer_mode = config.watcher == "informer"
    health = WatchHealth([TASK_PLURAL, WORKER_PLURAL, "leases"])
    controller = Controller(kube=port, clock=clock, config=config, health=health)
    silence.listen(controller.note_api_silence)
    metrics.serve(config.metrics_port)
    claims: ClaimServer | None = None
    if config.claim_port:
        # The store's lookup of a current claim; without one (no_claims) every claim is 404.
        lookup = getattr(controller, "claim_ref", None)
        claims = await ClaimServer.start(
            kubeconfig,
            lookup,
            port=config.claim_port,
            timeout=config.request_seconds,
            cert_file=config.claim_cert_file or None,
            key_file=config.claim_key_file or None,
        )
    metrics.LEADER.set(1 if controller.leading else 0)

    draining: list[asyncio.Task[None]] = []

    async def drain_then_stop() -> None:
        try:
            await controller.drain(config.request_seconds)
        finally:
            stop.set()

    def on_signal(sig: signal.Signals) -> None:
        log.info("%s: stopping (decisions first, then leadership, then watches)", sig.name)
        if not draining:  # a second signal changes nothing: the drain is bounded
            draining.append(asyncio.create_task(drain_then_stop()))

    def install_signals() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, on_signal, sig)

    install_signals()
    watch_stop = asyncio.Event()
    # Watches hold their connection for minutes: a pool of their own (unbounded), so they
    # never take the writers' places; the same credentials (one refresh serves both).
    watch_client = kube.Client(kubeconfig, pool=0, timeout=config.request_seconds)
    watchers: list[asyncio.Task[Any]] = []
    kopf_stop: asyncio.Future[None] = loop.create_future()
    if informer_mode:
        informers = _informers(config, watch_client, controller, health, silence)
        for informer in informers:
            watchers.append(
                asyncio.create_task(informer.run(watch_stop), name=f"watch-{informer.plural}")
            )
        task_informers = [i for i in informers if i.plural == TASK_PLURAL]

        async def catch_up() -> None:
            await asyncio.gather(*(i.catch_up() for i in task_informers))

        if config.leader_election:
            controller.catch_up = catch_up
        controller.cleanup.relist = catch_up  # finished tasks over MAX_FINISHED, again
    else:
        # kopf watches tasks, workers and Leases; the queues, budgets and namespaces are
        # the informer's. The first decisions wait for both (as in informer mode: a task
        # naming a queue is not judged on an empty store).
        on_synced = all_synced([KOPF_SYNCED, *CLUSTER_PLURALS], controller.set_synced)
        for informer in cluster_informers(watch_client, controller, silence, on_synced):
            watchers.append(
                asyncio.create_task(informer.run(watch_stop), name=f"watch-{informer.plural}")
            )
        watchers.append(
            asyncio.create_task(
                _kopf(
                    config,
                    kubeconfig,
                    watch_client,
                    controller,
                    health,
                    kopf_stop,
                    install_signals,
                    functools.partial(on_synced, KOPF_SYNCED),
                )
            )
        )

    elector: LeaderElector | None = None
    if config.leader_election:
        elector = LeaderElector(
            kube=port,
            clock=clock,
            namespace=config.leader_namespace,
            name=config.leader_lease,
            identity=config.identity,
            lease_seconds=config.leader_lease_seconds,
            renew_deadline=config.leader_renew_deadline,
            retry_seconds=config.leader_retry_seconds,
            on_change=controller.set_leading,
        )
        controller.use_elector(elector)
    core = [asyncio.create_task(controller.run(stop), name="controller")]
    if elector is not None:
        core.append(asyncio.create_task(elector.run(stop), name="leader"))
    else:
        # Nothing else asks the API server regularly: read a Lease every 2 s, so a silence
        # of the API server is noticed from about when it began (silence.py).
        pulse_task = pulse(port, config.leader_namespace, config.leader_lease, stop)
        core.append(asyncio.create_task(pulse_task, name="pulse"))
    log.info(
        "agentq operator %s started (leader election %s, watcher %s, credentials: %s)",
        config.identity,
        "on" if config.leader_election else "off",
        config.watcher,
        kubeconfig.credentials.kind,
    )
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([*core, *watchers, stopper], return_when=asyncio.FIRST_COMPLETED)
    # 1. stop deciding (the signal handler did, unless something else ended us)
    controller.stop_deciding()
    stop.set()
    for task in done:
        if task is not stopper and not task.cancelled() and task.exception() is not None:
            log.error("%s stopped: %r", task.get_name(), task.exception())
    # 2. release leadership (the elector's run() does it as it returns)
    await _bounded(asyncio.wait(core, timeout=SHUTDOWN_SECONDS))
    # 3. stop the watches and close the connections
    watch_stop.set()
    if not kopf_stop.done():
        kopf_stop.set_result(None)
    for task in [*core, *watchers]:
        task.cancel()
    await asyncio.gather(*core, *watchers, return_exceptions=True)
    await watch_client.close()
    if claims is not None:
        await claims.close()
    await port.close()
    log.info("agentq operator %s stopped", config.identity)


async def _bounded(awaitable: Awaitable[Any]) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(awaitable, timeout=SHUTDOWN_SECONDS)


async def _kopf(
    config: OperatorConfig,
    kubeconfig: kube.KubeConfig,
    client: kube.Client,
    controller: Controller,
    health: WatchHealth,
    stop_flag: asyncio.Future[None],
    install_signals: Any,
    on_synced: Callable[[], None],
) -> None:
    """kopf's watches (``--watcher kopf``), with the informer's guarantees (kopfwatch.py)
    and our signal handlers put back after its own."""
    import kopf

    from agentq.operator import kopfwatch
    from agentq.operator.handlers import make_registry, make_settings

    namespaces: list[str | None] = list(config.namespaces) or [None]
    selector = protocol.LABEL_LEASE_KIND  # kopf selects on the label being present
    targets = [
        kopfwatch.Target(
            plural, ns, _collection(plural, ns), selector if plural == "leases" else None
        )
        for plural in (TASK_PLURAL, WORKER_PLURAL, "leases")
        for ns in namespaces
    ]
    synced = kopfwatch.SyncSignal(client, targets, on_synced)

    def past_kopf(plural: str, kind: str, body: Body, size: int) -> None:
        controller.observe(plural, kind, body, size)
        synced.note(plural, kind, body)

    watch_health = kopfwatch.KopfWatchHealth(
        health, [TASK_PLURAL, WORKER_PLURAL, "leases"], namespaces, feed=past_kopf
    )
    if config.leader_election:

        async def catch_up() -> None:
            def feed(body: Body) -> None:
                controller.observe(TASK_PLURAL, "MODIFIED", body)

            for target in targets:
                if target.plural == TASK_PLURAL:
                    await kopfwatch.catch_up(client, target.path, feed)

        controller.catch_up = catch_up

    async def relist() -> None:
        def feed(body: Body) -> None:
            controller.observe(TASK_PLURAL, "MODIFIED", body)

        for target in targets:
            if target.plural == TASK_PLURAL:
                await kopfwatch.catch_up(client, target.path, feed)

    controller.cleanup.relist = relist  # finished tasks over MAX_FINISHED, again
    ready = asyncio.Event()

    async def after_ready() -> None:
        await ready.wait()
        install_signals()  # kopf replaced them with its own: take control back
        await synced.run()

    helper = asyncio.create_task(after_ready())
    try:
        with watch_health.installed():
            await kopf.operator(
                registry=make_registry(controller, kubeconfig, synced.note),
                settings=make_settings(),
                standalone=True,
                clusterwide=not config.namespaces,
                namespaces=list(config.namespaces),
                stop_flag=stop_flag,
                ready_flag=ready,
            )
    finally:
        helper.cancel()


def _collection(plural: str, namespace: str | None) -> str:
    group, version = ("coordination.k8s.io", "v1") if plural == "leases" else (GROUP, VERSION)
    if plural == "namespaces":
        group, version = "", "v1"
    return kube.object_path(group, version, namespace, plural)
