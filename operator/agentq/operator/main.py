"""Wires the operator together and runs it: kopf's watches, the leader elector,
the controller loop and the metrics endpoint, on one event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import signal

import kopf

from agentq.clock import SystemClock
from agentq.operator import metrics
from agentq.operator.config import OperatorConfig
from agentq.operator.controller import Controller
from agentq.operator.handlers import make_registry, make_settings
from agentq.operator.kube import Kube, make_api_client
from agentq.operator.leader import LeaderElector
from agentq.operator.store import Store

log = logging.getLogger("agentq.operator")


async def run(config: OperatorConfig, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    # Sync API calls run in threads: enough of them for the configured write concurrency
    # plus events and watches' bookkeeping.
    loop.set_default_executor(
        concurrent.futures.ThreadPoolExecutor(max_workers=config.write_concurrency * 2 + 4)
    )
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)

    clock = SystemClock()
    kube = Kube(
        make_api_client(pool_size=config.write_concurrency * 2 + 4),
        clock,
        component="agentq-operator",
    )
    controller = Controller(store=Store(), kube=kube, clock=clock, config=config)
    metrics.serve(config.metrics_port)
    metrics.LEADER.set(1 if controller.leading else 0)

    kopf_stop: asyncio.Future[None] = loop.create_future()
    tasks = [
        asyncio.create_task(
            kopf.operator(
                registry=make_registry(controller),
                settings=make_settings(),
                standalone=True,
                clusterwide=not config.namespaces,
                namespaces=list(config.namespaces),
                stop_flag=kopf_stop,
            ),
            name="kopf",
        ),
        asyncio.create_task(controller.run(stop), name="controller"),
    ]
    if config.leader_election:
        elector = LeaderElector(
            kube=kube,
            clock=clock,
            namespace=config.leader_namespace,
            name=config.leader_lease,
            identity=config.identity,
            lease_seconds=config.leader_lease_seconds,
            renew_seconds=config.leader_renew_seconds,
            retry_seconds=config.leader_retry_seconds,
            on_change=controller.set_leading,
        )
        tasks.append(asyncio.create_task(elector.run(stop), name="leader"))
    log.info(
        "agentq operator %s started (leader election %s)",
        config.identity,
        "on" if config.leader_election else "off",
    )
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
    stop.set()
    if not kopf_stop.done():
        kopf_stop.set_result(None)
    for task in done:
        if task is not stopper and task.exception() is not None:
            log.error("%s stopped: %r", task.get_name(), task.exception())
    await asyncio.wait(tasks, timeout=10)
    for task in tasks:
        task.cancel()
