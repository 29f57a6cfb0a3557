"""The repository's kustomize bases, rendered for tests and the e2e scenario.

``install_base()`` is ``kubectl kustomize manifests/``; ``agent_objects()``
renders ``manifests/agent/`` (whose worker is "example") for another worker, the
way a user copies it: every "example" in a name, label, account or env value
becomes the worker's name.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ROOT / "manifests"
# The install with the claim port over TLS from cert-manager, and its agent.
CERT_MANAGER = ROOT / "examples" / "cert-manager"
EXAMPLE_WORKER = "example"


def kustomize(kubectl: str, directory: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [kubectl, "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def overlay(where: Path, base: Path, *components: Path) -> Path:
    """``where``, made a kustomization of ``base`` with ``components`` added, as a
    user's overlay of the repository's (kustomize takes relative paths only)."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [os.path.relpath(base, where)],
                "components": [os.path.relpath(c, where) for c in components],
            }
        )
    )
    return where


def install_base(
    kubectl: str, *, image: str | None = None, directory: Path = MANIFESTS
) -> list[dict[str, Any]]:
    """The install base's objects (or an overlay's, ``directory``), with the operator's
    image replaced if given."""
    objects = kustomize(kubectl, directory)
    if image:
        for obj in objects:
            for container in containers(obj):
                container["image"] = image
    return objects


WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "Pod")


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """A workload's containers, init containers first (none for other kinds)."""
    if obj.get("kind") not in WORKLOADS:
        return []
    spec = obj["spec"]["template"]["spec"] if "template" in obj["spec"] else obj["spec"]
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def agent_objects(
    kubectl: str,
    *,
    worker: str,
    namespace: str,
    image: str | None = None,
    env: dict[str, str] | None = None,
    agent_args: list[str] | None = None,
    directory: Path = MANIFESTS / "agent",
) -> list[dict[str, Any]]:
    """``manifests/agent/`` (or an overlay of it, ``directory``) for ``worker`` in
    ``namespace``.

    ``env`` sets (or adds) variables of the sidecar container; ``agent_args``
    replaces the agent container's arguments.
    """
    rendered = json.dumps(kustomize(kubectl, directory))
    # Names, labels, the account and AGENTQ_WORKER all carry the worker's name.
    rendered = rendered.replace(f'"{EXAMPLE_WORKER}"', json.dumps(worker))
    rendered = rendered.replace(f'-{EXAMPLE_WORKER}"', f'-{worker}"')
    objects: list[dict[str, Any]] = json.loads(rendered)
    for obj in objects:
        obj["metadata"]["namespace"] = namespace
        if obj["kind"] == "RoleBinding":
            for subject in obj["subjects"]:
                subject["namespace"] = namespace
        for container in containers(obj):
            if image:
                container["image"] = image
            if container["name"] == "sidecar" and env:
                variables = {e["name"]: e for e in container.get("env", [])}
                for name, value in env.items():
                    variables[name] = {"name": name, "value": value}
                container["env"] = list(variables.values())
            if container["name"] == "agent" and agent_args is not None:
                container["args"] = agent_args
    return objects


def to_yaml(objects: list[dict[str, Any]]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False)
