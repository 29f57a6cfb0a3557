"""The operator with kopf's watches (``--watcher kopf``) has the default's guarantees:
it decides once kopf has fed it what a LIST showed (no fixed sleep), and its watches
report their health -- unhealthy while the API server is down (no expiry is judged
then), healthy again when it is back. On a control plane of its own: the API server
is restarted."""

from __future__ import annotations

import contextlib
import re
import threading
import time
import urllib.request
import uuid
from pathlib import Path

from agentq.controlplane import Cluster
from agentq.controlplane.cluster import ClusterState, free_port
from builders import task
from fleet import Fleet

RESOURCES = ("agenttasks", "agentworkers", "leases")


def watch_health(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as rsp:
        text = rsp.read().decode()
    found = re.findall(r'^agentq_watch_healthy\{resource="(\w+)"\} (\S+)$', text, re.MULTILINE)
    return {resource: float(value) for resource, value in found}


def wait(what: str, check: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_kopf_watches_sync_on_a_listing_and_report_their_health(
    own_cluster: tuple[Cluster, ClusterState], tmp_path: Path
) -> None:
    cluster, state = own_cluster
    fleet = Fleet(
        kubeconfig=state.kubeconfig,
        namespace=f"kopf-{uuid.uuid4().hex[:6]}",
        workdir=tmp_path,
        kubectl=state.binaries["kubectl"],
    )
    try:
        fleet.kubectl("create", "namespace", fleet.namespace)
        fleet.agent("w", "complete", capabilities="llm", work_seconds=0.05)
        for i in range(10):  # a backlog before the operator starts
            fleet.add_task(task(f"t{i}").requires("llm"))
        port = free_port()
        operator = fleet.operator("--watcher", "kopf", "--metrics-port", str(port))

        def healthy() -> bool:
            try:
                health = watch_health(port)
            except OSError:
                return False
            return all(health.get(r) == 1.0 for r in RESOURCES)

        wait("kopf's watches healthy", healthy, 60)
        wait("synced on a listing", lambda: "kopf watcher: synced" in operator.text(), 30)
        fleet.wait_all(
            lambda ts: (
                len(ts) == 10
                and all((t.get("status") or {}).get("phase") == "Succeeded" for t in ts)
            ),
            timeout=90,
        )

        # The restart runs on this thread: the new kube-apiserver is tied to the thread
        # that starts it (PR_SET_PDEATHSIG). A thread of its own watches the metric.
        unhealthy: list[dict[str, float]] = []
        done = threading.Event()

        def watch_metric() -> None:
            while not done.is_set() and not unhealthy:
                with contextlib.suppress(OSError):
                    health = watch_health(port)
                    if 0.0 in health.values():
                        unhealthy.append(health)
                time.sleep(0.2)

        poller = threading.Thread(target=watch_metric)
        poller.start()
        try:
            cluster.restart("kube-apiserver", down_seconds=8, timeout=120)
        finally:
            done.set()
            poller.join()
        assert unhealthy, "no watch was unhealthy while the API server was down"
        wait("kopf's watches healthy again", healthy, 90)
        fleet.add_task(task("after").requires("llm"))
        fleet.wait_phase("after", "Succeeded", timeout=60)
    finally:
        fleet.close()
