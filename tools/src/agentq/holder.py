"""Raw writes to a Lease, for a process that holds it without a sidecar.

The sidecar (``agentq.sidecar``) is how agents hold Leases: one request per
renewal, agent-gated. This module is the raw, synchronous path a test uses to
stand in for a holder that bypasses the sidecar (a zombie writing its report
straight onto the Lease, a late report in a grace period), and what the
``scripted_agent`` stand-in used before the sidecar existed.

Each write here is a compare-and-swap: read the Lease, check it is still ours
(holder and fencing token), change it, and replace it with the resourceVersion
we read (two requests); a concurrent change is a 409 and we re-read rather than
guess. A Lease that is gone, or granted to someone else or with another token,
raises ``LeaseLost``: the attempt must stop.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

from kubernetes import client
from kubernetes.client.rest import ApiException

from agentq import protocol
from agentq.clock import micro_rfc3339

_CAS_ATTEMPTS = 5


class LeaseLost(RuntimeError):
    """The Lease is gone or no longer ours (another holder, or a newer token)."""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _update(
    leases: client.CoordinationV1Api,
    namespace: str,
    name: str,
    change: Callable[[client.V1Lease], None],
) -> client.V1Lease:
    for _ in range(_CAS_ATTEMPTS):
        try:
            lease = leases.read_namespaced_lease(name, namespace)
        except ApiException as err:
            if err.status == 404:
                raise LeaseLost(f"lease {namespace}/{name} no longer exists") from err
            raise
        change(lease)
        try:
            updated: client.V1Lease = leases.replace_namespaced_lease(name, namespace, lease)
            return updated
        except ApiException as err:
            if err.status == 409:
                continue  # someone wrote in between: re-read and re-check ownership
            if err.status == 404:
                raise LeaseLost(f"lease {namespace}/{name} no longer exists") from err
            raise
    raise LeaseLost(f"lease {namespace}/{name} kept changing under us ({_CAS_ATTEMPTS} conflicts)")


def _check_ours(lease: client.V1Lease, *, worker: str, token: int) -> None:
    holder = lease.spec.holder_identity if lease.spec else None
    current = protocol.lease_token(lease.metadata.annotations)
    if holder != worker or current != token:
        raise LeaseLost(
            f"lease {lease.metadata.namespace}/{lease.metadata.name} is held by {holder!r} "
            f"with token {current}, not by {worker!r} with token {token}"
        )


def renew_task_lease(
    leases: client.CoordinationV1Api,
    namespace: str,
    task: str,
    *,
    worker: str,
    token: int,
    progress: str | None = None,
) -> client.V1Lease:
    """Renew the claim on ``task`` (and set its progress marker) if it is still ours."""
    if progress is not None:
        protocol.check_progress(progress)

    def change(lease: client.V1Lease) -> None:
        _check_ours(lease, worker=worker, token=token)
        lease.spec.renew_time = micro_rfc3339(_now())
        if progress is not None:
            lease.metadata.annotations = {
                **(lease.metadata.annotations or {}),
                protocol.ANNOTATION_PROGRESS: progress,
            }

    return _update(leases, namespace, protocol.task_lease_name(task), change)


def write_report(
    leases: client.CoordinationV1Api, namespace: str, task: str, report: protocol.Report
) -> client.V1Lease:
    """Put the attempt's final report on the claim's Lease, if the claim is still ours.

    The operator commits it to the task only if the token is still current when
    it reads it; this check here only spares a zombie a pointless write.
    """
    encoded = report.encode()

    def change(lease: client.V1Lease) -> None:
        _check_ours(lease, worker=report.worker, token=report.token)
        lease.spec.renew_time = micro_rfc3339(_now())
        lease.metadata.annotations = {
            **(lease.metadata.annotations or {}),
            protocol.ANNOTATION_REPORT: encoded,
        }

    return _update(leases, namespace, protocol.task_lease_name(task), change)


def renew_worker_lease(
    leases: client.CoordinationV1Api,
    namespace: str,
    worker: str,
    *,
    identity: str,
    duration_seconds: int = 15,
) -> client.V1Lease:
    """Create or renew the worker's own Lease (``agentq-worker-<name>``): its readiness."""
    name = protocol.worker_lease_name(worker)
    now = micro_rfc3339(_now())
    try:
        lease: client.V1Lease = leases.read_namespaced_lease(name, namespace)
    except ApiException as err:
        if err.status != 404:
            raise
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(
                name=name,
                labels={
                    protocol.LABEL_LEASE_KIND: "worker",
                    protocol.LABEL_WORKER: protocol.label_value(worker),
                },
            ),
            spec=client.V1LeaseSpec(
                holder_identity=identity,
                lease_duration_seconds=duration_seconds,
                acquire_time=now,
                renew_time=now,
                lease_transitions=0,
            ),
        )
        created: client.V1Lease = leases.create_namespaced_lease(namespace, body)
        return created
    if lease.spec.holder_identity != identity:
        lease.spec.lease_transitions = (lease.spec.lease_transitions or 0) + 1
        lease.spec.acquire_time = now
    lease.spec.holder_identity = identity
    lease.spec.lease_duration_seconds = duration_seconds
    lease.spec.renew_time = now
    renewed: client.V1Lease = leases.replace_namespaced_lease(name, namespace, lease)
    return renewed
