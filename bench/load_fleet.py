"""The load benchmark's agent fleet: one process standing in for many agent pods.

It keeps the worker Leases of ``--workers`` AgentWorkers fresh (one PUT per
renewal, carrying the resourceVersion of its last write, as the sidecar does)
and, with ``--hold``, renews every task Lease granted to those workers. It
never reports: the benchmark measures dispatch, renewal and reclaim, not work.

It prints one JSON line per event the driver waits for: ``{"ready": n}`` when
every worker Lease exists, and ``{"round": k, "start": t, "end": t, "renewed":
n}`` after each round of task-Lease renewals (monotonic seconds of this host),
so the driver can tell when each held Lease was last renewed before it killed us.

usage: python bench/load_fleet.py --kubeconfig K --namespace NS --workers N [--hold]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp
from load_common import LEASES, Api, bounded, connect

from agentq import protocol


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def keep_workers(api: Api, ns: str, names: list[str], args: argparse.Namespace) -> None:
    leases: dict[str, dict[str, Any]] = {}

    async def create(name: str) -> None:
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": protocol.worker_lease_name(name),
                "labels": {
                    protocol.LABEL_LEASE_KIND: "worker",
                    protocol.LABEL_WORKER: protocol.label_value(name),
                },
            },
            "spec": {
                "holderIdentity": f"{name}-fleet",
                "leaseDurationSeconds": args.worker_lease_seconds,
                "acquireTime": now(),
                "renewTime": now(),
            },
        }
        status, got = await api.request("POST", LEASES.format(ns=ns), body, ok=(201,))
        if status == 409:
            status, got = await api.request(
                "GET", LEASES.format(ns=ns) + "/" + protocol.worker_lease_name(name)
            )
        leases[name] = got

    await bounded([lambda n=n: create(n) for n in names], 32)  # type: ignore[misc]
    say(ready=len(leases))
    # Spread renewals evenly over the interval, as a real fleet's would be.
    while True:
        started = time.monotonic()
        for i, name in enumerate(names):
            due = started + args.worker_renew_seconds * i / len(names)
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            asyncio.get_running_loop().create_task(renew(api, ns, leases, name))
        rest = started + args.worker_renew_seconds - time.monotonic()
        if rest > 0:
            await asyncio.sleep(rest)


async def renew(api: Api, ns: str, leases: dict[str, dict[str, Any]], name: str) -> None:
    lease = leases[name]
    lease["spec"]["renewTime"] = now()
    path = LEASES.format(ns=ns) + "/" + lease["metadata"]["name"]
    try:
        status, got = await api.request("PUT", path, lease)
        if status == 200:
            leases[name] = got
        elif status == 409:
            status, got = await api.request("GET", path)
            if status == 200:
                leases[name] = got
    except (aiohttp.ClientError, TimeoutError, ValueError):
        pass  # renewed again in the next interval, as a sidecar would


async def hold_tasks(api: Api, ns: str, args: argparse.Namespace) -> None:
    """Renew every task Lease of this namespace once per ``--task-renew-seconds``."""
    rounds = 0
    last: dict[str, float] = {}
    selector = f"{protocol.LABEL_LEASE_KIND}=task"
    while True:
        started = time.monotonic()
        try:
            items, _ = await api.list_all(LEASES.format(ns=ns) + f"?labelSelector={selector}")
        except (RuntimeError, aiohttp.ClientError, TimeoutError, ValueError) as err:
            say(error=f"list of task Leases failed: {err}")
            await asyncio.sleep(1)
            continue
        if args.progress:
            marker = f"step-{rounds}"
        for item in items:
            item["spec"]["renewTime"] = now()
            if args.progress:
                item["metadata"].setdefault("annotations", {})[protocol.ANNOTATION_PROGRESS] = (
                    marker
                )
        paths = [LEASES.format(ns=ns) + "/" + i["metadata"]["name"] for i in items]
        renewed_at: dict[str, float] = {}

        async def put(
            path: str, item: dict[str, Any], renewed_at: dict[str, float] = renewed_at
        ) -> None:
            try:
                status, _ = await api.request("PUT", path, item)
            except (aiohttp.ClientError, TimeoutError):
                return  # not renewed this round; the next round tries again
            if status == 200:
                renewed_at[item["metadata"]["name"]] = time.monotonic()

        await bounded(
            [lambda p=p, i=i: put(p, i) for p, i in zip(paths, items, strict=True)],  # type: ignore[misc]
            args.concurrency,
        )
        renewed = len(renewed_at)
        if args.renew_log:
            # When each Lease was last renewed (CLOCK_MONOTONIC, shared by every process of
            # this host): the driver reads it after killing us to time each reclaim exactly.
            log = Path(args.renew_log)
            last.update(renewed_at)
            log.with_suffix(".tmp").write_text(json.dumps(last))
            log.with_suffix(".tmp").replace(log)
        rounds += 1
        say(round=rounds, start=started, end=time.monotonic(), renewed=renewed)
        rest = started + args.task_renew_seconds - time.monotonic()
        if rest > 0:
            await asyncio.sleep(rest)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--worker-lease-seconds", type=int, default=15)
    parser.add_argument("--worker-renew-seconds", type=float, default=5.0)
    parser.add_argument("--hold", action="store_true", help="renew the granted task Leases")
    parser.add_argument("--task-renew-seconds", type=float, default=1.0)
    parser.add_argument("--progress", action="store_true", help="change progress each round")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--renew-log", help="file: task Lease name -> last renewal time")
    args = parser.parse_args()
    api = Api(connect(args.kubeconfig))
    names = [f"w{i:04d}" for i in range(args.workers)]
    jobs = [keep_workers(api, args.namespace, names, args)]
    if args.hold:
        jobs.append(hold_tasks(api, args.namespace, args))
    await asyncio.gather(*jobs)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
