"""charts/agentq rendered and installed with the pinned helm, for tests and the e2e run.

``helm()`` runs the helm that ``make helm`` built (or finds) with its config, cache and
data directories in a place of the caller's (nothing written under ``$HOME``);
``normalized()`` strips what Helm adds to an object (its labels, the CRDs'
resource-policy annotation) so the chart's objects compare with ``kubectl kustomize``'s.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from agentq.controlplane import binaries

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "agentq"

# What the chart adds to the manifests' objects: Helm's labels, and the annotation
# that keeps the CRDs on uninstall (values crds.keep).
HELM_LABELS = (
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
)
HELM_ANNOTATIONS = ("helm.sh/resource-policy",)

# CEL expressions (CRD rules, admission policies), compared with their whitespace
# collapsed: kustomize's YAML library reads a folded scalar with more-indented lines
# (the CRDs' multi-line rules) with an extra line break that helm's does not; CEL
# ignores whitespace outside string literals, and none of ours spans a line break.
CEL_FIELDS = frozenset({"rule", "expression", "messageExpression"})

Key = tuple[str, str, str, str]  # apiVersion, kind, namespace, name


def helm_path() -> str:
    """The pinned helm, built or found; BinaryError (saying `make helm`) if neither."""
    return str(binaries.resolve(build=False, binary_set=binaries.HELM)["helm"])


def helm_env(home: Path, kubeconfig: str | None = None) -> dict[str, str]:
    env = {
        **os.environ,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    if kubeconfig:
        env["KUBECONFIG"] = kubeconfig
    return env


def helm(
    home: Path,
    *args: str,
    kubeconfig: str | None = None,
    check: bool = True,
    timeout: float = 180,
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [helm_path(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=helm_env(home, kubeconfig),
        check=False,
    )
    if check and done.returncode != 0:
        raise AssertionError(
            f"helm {' '.join(args)} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}"
        )
    return done


def set_args(values: dict[str, str] | None) -> list[str]:
    return [arg for key, value in (values or {}).items() for arg in ("--set", f"{key}={value}")]


def template(
    home: Path,
    *,
    values: dict[str, str] | None = None,
    namespace: str = "default",
    release: str = "agentq",
    extra: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """``helm template`` of the chart, parsed (empty documents dropped)."""
    done = helm(
        home,
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        *set_args(values),
        *extra,
    )
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def key(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata", {})
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def _cel_collapsed(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: " ".join(v.split()) if k in CEL_FIELDS and isinstance(v, str) else _cel_collapsed(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_cel_collapsed(v) for v in node]
    return node


def normalized(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` without what Helm adds, its CEL whitespace collapsed (a copy)."""
    out: dict[str, Any] = _cel_collapsed(obj)
    meta = out.get("metadata", {})
    for field, added in (("labels", HELM_LABELS), ("annotations", HELM_ANNOTATIONS)):
        if field in meta:
            for name in added:
                meta[field].pop(name, None)
            if not meta[field]:
                del meta[field]
    return out


def by_key(objects: Iterable[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    indexed: dict[Key, dict[str, Any]] = {}
    for obj in objects:
        assert key(obj) not in indexed, f"rendered twice: {key(obj)}"
        indexed[key(obj)] = normalized(obj)
    return indexed
