"""AgentTask manifests for the client (pure): built from keyword arguments, or a given one
checked for its shape. The fields themselves are the API server's to judge (its
message is the one a user sees)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agentq.client.outcome import ManifestError
from agentq.models import API_VERSION

Body = dict[str, Any]
KIND = "AgentTask"
# A DNS subdomain (an object's name; a namespace is a narrower DNS label).
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


# --- manifests (pure) ----------------------------------------------------------------------

# Keyword argument -> spec field.
SPEC_FIELDS = {
    "required_capabilities": "requiredCapabilities",
    "cost": "cost",
    "payload": "payload",
    "lease_duration_seconds": "leaseDurationSeconds",
    "heartbeat_interval_seconds": "heartbeatIntervalSeconds",
    "progress_deadline_seconds": "progressDeadlineSeconds",
    "max_reclaims": "maxReclaims",
    "on_lease_expiry": "onLeaseExpiry",
    "grace_period_seconds": "gracePeriodSeconds",
    "retry_backoff": "retryBackoff",
    "cancel": "cancel",
    "active_deadline_seconds": "activeDeadlineSeconds",
    "ttl_seconds_after_finished": "ttlSecondsAfterFinished",
    "priority": "priority",
}


def task_manifest(
    *,
    name: str | None = None,
    generate_name: str | None = None,
    namespace: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    spec: Mapping[str, Any] | None = None,
    **fields: Any,
) -> Body:
    """An AgentTask manifest from keyword arguments (``SPEC_FIELDS``; ``spec`` adds fields
    as the API spells them). Without ``name`` the API server makes one up from
    ``generate_name`` (default ``task-``). Values are checked by the API server."""
    unknown = sorted(set(fields) - set(SPEC_FIELDS))
    if unknown:
        raise TypeError(
            f"unknown AgentTask field(s) {', '.join(unknown)}; the fields are "
            f"{', '.join(SPEC_FIELDS)} (or pass spec={{...}} as the API spells them)"
        )
    if name and generate_name:
        raise ManifestError("give name or generate_name, not both")
    meta: Body = {"name": name} if name else {"generateName": generate_name or "task-"}
    if namespace:
        meta["namespace"] = namespace
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    body_spec = {SPEC_FIELDS[k]: v for k, v in fields.items() if v is not None}
    if spec:
        body_spec.update(spec)
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, "spec": body_spec}


def check_manifest(manifest: Any, *, namespace: str | None = None) -> Body:
    """``manifest`` as an AgentTask to create in ``namespace`` (a copy), or
    ``ManifestError`` saying what is wrong. Only the shape is checked here (kind, a
    name, one namespace); the fields are the API server's to judge."""
    if not isinstance(manifest, Mapping):
        raise ManifestError(f"an AgentTask manifest is a mapping, not {type(manifest).__name__}")
    kind, api_version = manifest.get("kind"), manifest.get("apiVersion")
    if kind != KIND or api_version != API_VERSION:
        shown = f"{api_version or '(no apiVersion)'} {kind or '(no kind)'}"
        raise ManifestError(
            f"expected apiVersion {API_VERSION} and kind {KIND}, got {shown}" + _named(manifest)
        )
    meta = manifest.get("metadata")
    if meta is None:
        meta = {}
    if not isinstance(meta, Mapping):
        raise ManifestError("metadata is not a mapping")
    if not meta.get("name") and not meta.get("generateName"):
        raise ManifestError("metadata.name or metadata.generateName is required")
    given = meta.get("namespace")
    for field, value in (("namespace", given or namespace), ("name", meta.get("name"))):
        if value and not (isinstance(value, str) and _NAME.fullmatch(value)):
            # Checked here, not by the API server: a name is part of the request's path.
            raise ManifestError(
                f"metadata.{field} {value!r} is not a Kubernetes name (lower-case letters, "
                "digits, '-' and '.', at most 253 characters)" + _named(manifest)
            )
    if namespace and given and given != namespace:
        raise ManifestError(
            f"the namespace of the manifest ({given}) does not match the namespace asked "
            f"for ({namespace})" + _named(manifest)
        )
    body = dict(manifest)
    body["metadata"] = {**meta, "namespace": given or namespace}
    return body


def _named(manifest: Mapping[str, Any]) -> str:
    meta = manifest.get("metadata")
    name = meta.get("name") or meta.get("generateName") if isinstance(meta, Mapping) else None
    return f" (in {name!r})" if name else ""
