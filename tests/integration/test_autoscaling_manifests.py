"""manifests/examples/autoscaling/ against KEDA's own CRDs (the pinned KEDA that
``make keda`` builds) on the real API server, and its query against promtool.

The chart renders the same objects (tests/unit/test_helm_chart.py), so this holds for
``autoscaledPool`` too. docs/autoscaling.md.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from agentq.controlplane import binaries
from fleet import ControlPlane
from kedatools import wait_until_not_terminating
from manifests import MANIFESTS, kustomize

EXAMPLE = MANIFESTS / "examples" / "autoscaling"
# KEDA's CRDs are cluster-wide on the shared control plane, and test_keda_scaling.py's
# clean-up deletes them: one group, so the two never run at once.
pytestmark = pytest.mark.xdist_group("keda-crds")


@pytest.fixture(scope="module")
def keda_crds() -> Path:
    try:
        found = binaries.resolve(build=False, binary_set=binaries.KEDA)
    except binaries.BinaryError as err:
        pytest.skip(f"KEDA not built ({err}); make keda")
    return found["keda-operator"].parent / "crd"


def test_the_example_is_valid_for_kedas_crds(
    control_plane: ControlPlane, keda_crds: Path, namespace: str
) -> None:
    wait_until_not_terminating(control_plane, "scaledobjects.keda.sh")
    control_plane.kubectl("apply", "--server-side", "-f", str(keda_crds), timeout=120)
    deadline = time.monotonic() + 60
    while True:
        crd = json.loads(
            control_plane.kubectl("get", "crd/scaledobjects.keda.sh", "-o", "json").stdout
        )
        conditions = (crd.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            break
        assert time.monotonic() < deadline, "KEDA's ScaledObject CRD not Established"
        time.sleep(0.5)
    objects = [
        o for o in kustomize(control_plane.kubectl_path, EXAMPLE) if o["kind"] != "Namespace"
    ]
    assert {o["kind"] for o in objects} == {
        "ServiceAccount",
        "RoleBinding",
        "Deployment",
        "ScaledObject",
    }
    for obj in objects:
        obj["metadata"]["namespace"] = namespace
    done = control_plane.kubectl(
        "apply",
        "--dry-run=server",
        "-o",
        "json",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
    )
    applied = {item["kind"]: item for item in json.loads(done.stdout)["items"]}
    scaled = applied["ScaledObject"]["spec"]
    assert scaled["scaleTargetRef"]["name"] == applied["Deployment"]["metadata"]["name"]
    assert (scaled["minReplicaCount"], applied["Deployment"]["spec"]["replicas"]) == (0, 0)
    assert scaled["triggers"][0]["type"] == "prometheus"


def test_the_examples_query_is_valid_promql(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed: `make system-deps` installs Debian's prometheus")
    scaled = next(
        yaml.safe_load(doc)
        for doc in (EXAMPLE / "scaledobject.yaml").read_text().split("\n---\n")
        if "ScaledObject" in doc
    )
    query = scaled["spec"]["triggers"][0]["metadata"]["query"]
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        yaml.safe_dump(
            {"groups": [{"name": "pool", "rules": [{"record": "pool:work", "expr": query}]}]}
        )
    )
    done = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
