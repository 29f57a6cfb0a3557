"""KEDA scales the example pool's Deployment on agentq's queue, 0 -> N -> 0, on the real
API server (docs/autoscaling.md).

The pinned KEDA (``make keda``) runs as processes beside the embedded control plane (its
API server has the aggregation layer, so the HPA reads KEDA's external metric), a
Prometheus process scrapes the operator, and manifests/examples/autoscaling/'s
Deployment and ScaledObject are applied as shipped but for the namespace, the
Prometheus address and shorter periods. No node: the pool's pods stay Pending and no
worker takes the tasks, so the backlog holds while the Deployment is watched going
from 0 to 1 (KEDA's activation) to 3 (the HPA: 6 pending tasks / 2 per pod), and
back to 0 once the tasks are gone. That the pods that go drain first is
tests/integration/test_operator_dispatch.py's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentq.controlplane import binaries
from agentq.controlplane.cluster import free_port
from builders import task
from fleet import ControlPlane, Fleet
from kedatools import Keda, Prometheus
from manifests import MANIFESTS, kustomize

# KEDA's CRDs are cluster-wide on the shared control plane (see
# test_autoscaling_manifests.py): one group, run one after the other.
pytestmark = pytest.mark.xdist_group("keda-crds")

EXAMPLE = MANIFESTS / "examples" / "autoscaling"
DEPLOYMENT = "agent-pool-llm"


@pytest.fixture
def keda(control_plane: ControlPlane, tmp_path: Path) -> Iterator[Keda]:
    try:
        binaries.resolve(build=False, binary_set=binaries.KEDA)
    except binaries.BinaryError as err:
        pytest.skip(f"KEDA not built ({err}); make keda")
    running = Keda(control_plane, tmp_path)
    try:
        running.start()
        yield running
    finally:
        running.stop()


def _pool(control_plane: ControlPlane, namespace: str, prometheus: str) -> list[dict[str, Any]]:
    objects = [
        o
        for o in kustomize(control_plane.kubectl_path, EXAMPLE)
        if o["kind"] in ("Deployment", "ScaledObject")
    ]
    for obj in objects:
        obj["metadata"]["namespace"] = namespace
        if obj["kind"] == "ScaledObject":
            spec = obj["spec"]
            spec.update(pollingInterval=1, cooldownPeriod=5)
            spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"] = {
                "stabilizationWindowSeconds": 0
            }
            trigger = spec["triggers"][0]["metadata"]
            trigger["serverAddress"] = prometheus
            trigger["query"] = trigger["query"].replace('"agentq-pool"', f'"{namespace}"')
    return objects


def test_keda_scales_the_pool_on_the_queue_and_back_to_zero(
    fleet: Fleet, control_plane: ControlPlane, keda: Keda, tmp_path: Path
) -> None:
    metrics_port = free_port()
    fleet.operator("--metrics-port", str(metrics_port))
    prometheus = Prometheus(tmp_path, [f"127.0.0.1:{metrics_port}"])
    try:
        control_plane.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "List",
                    "items": _pool(control_plane, fleet.namespace, prometheus.url),
                }
            ),
        )
        replicas: list[int] = []

        def scaled(want: int, timeout: float) -> None:
            deadline = time.monotonic() + timeout
            while True:
                got = control_plane.kubectl(
                    "-n", fleet.namespace, "get", "deploy", DEPLOYMENT, "-o", "json"
                )
                now = int(json.loads(got.stdout)["spec"].get("replicas") or 0)
                if not replicas or replicas[-1] != now:
                    replicas.append(now)
                if now == want:
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"{DEPLOYMENT} at {now} replicas, not {want}, after {timeout}s "
                        f"(seen {replicas}); query says "
                        f"{prometheus.query('agentq_namespace_pending_tasks')}\n{keda.tail()}"
                    )
                time.sleep(0.5)

        scaled(0, 30)  # nothing to do: KEDA keeps it at 0
        for i in range(6):
            fleet.add_task(task(f"t{i}").requires("llm"))
        scaled(3, 150)  # 6 tasks, 2 per pod: KEDA activates it (0 -> 1), the HPA the rest
        for i in range(6):
            fleet.kubectl("delete", "agenttask", f"t{i}")
        scaled(0, 120)  # no work: KEDA takes it back to 0 after its cooldown
        assert replicas[0] == 0 and max(replicas) == 3 and replicas[-1] == 0, replicas
        print(f"{DEPLOYMENT} replicas seen: {replicas}")
    finally:
        prometheus.stop()
