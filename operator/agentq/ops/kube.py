"""The ops verbs' only door to the API server.

A thin, synchronous wrapper (a CLI does one thing at a time: no threads, no
event loop) around the handful of calls the verbs make. It returns plain dicts
as the API server sends them (camelCase), so the pure modules
(``explain``, ``fleet``, ``redrive``) never see a client object and are tested
without a cluster.

It also owns turning failures into errors a person can act on, each with its
exit code (``errors.Exit``): no kubeconfig, an unreachable API server, refused
credentials and missing CRDs are ``NO_CLUSTER``; a missing named object is
``NOT_FOUND``; anything else the API server refuses is ``PARTIAL``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentq import GROUP, VERSION, client, kube, protocol
from agentq.kube.sync import SyncClient
from agentq.models import BUDGET_PLURAL, QUEUE_PLURAL, TASK_PLURAL, WORKER_PLURAL
from agentq.ops.errors import Exit, OpsError

Body = dict[str, Any]

# (connect, read) seconds: a CLI should fail in seconds, not hang, when the server is gone.
REQUEST_TIMEOUT = (5.0, 30.0)
MERGE = kube.MERGE_PATCH
RETRY_AFTER_MAX = 5.0  # the longest a verb waits on the API server's Retry-After, once
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

NO_CLUSTER_HINT = (
    "For the embedded control plane run `agentq cluster up` then "
    '`eval "$(agentq cluster env)"`; for another cluster set KUBECONFIG or pass '
    "--kubeconfig/--context (see `kubectl config get-contexts`)."
)
NO_CRDS_HINT = (
    "The agentq CRDs are not installed in this cluster: install them with "
    "`kubectl apply -f crds/` (see docs/quickstart.md)."
)


def find_config(kubeconfig: str | None, context: str | None) -> kube.KubeConfig:
    """The API server as kubectl finds it (``agentq.client.find_config``); else
    ``OpsError(NO_CLUSTER)`` saying what to do."""
    try:
        return client.find_config(kubeconfig, context)
    except client.NoCluster as err:
        hint = "" if "service account" in str(err) else f". {NO_CLUSTER_HINT}"
        raise OpsError(f"{err}{hint}", Exit.NO_CLUSTER) from err


def refusal(
    status: int, body: Mapping[str, Any], text: str, what: str, *, server: str, source: str
) -> OpsError:
    """An API server's refusal as an error a person can act on, with its exit code."""
    message = body.get("message") or text.strip() or "no message"
    if status == 404:
        if (body.get("details") or {}).get("name"):
            return OpsError(f"{what or 'object'} not found: {message}", Exit.NOT_FOUND)
        return OpsError(f"{NO_CRDS_HINT} (API server: {message})", Exit.NO_CLUSTER)
    if status == 401:
        return OpsError(
            f"the API server at {server} refused our credentials ({source}): "
            f"{message}. Log in again or pick another context.",
            Exit.NO_CLUSTER,
        )
    if status == 403:
        return OpsError(
            f"forbidden: {message}. The ops verbs need get/list/watch on agenttasks, "
            "get/list on agentworkers, leases and events, create on agenttasks (submit), "
            "patch on agenttasks (requeue, cancel) and agentworkers (drain, uncordon); "
            "see docs/cli.md#permissions.",
            Exit.PARTIAL,
        )
    return OpsError(f"the API server refused: {status} {message}", Exit.PARTIAL)


class Refused(Exception):
    """The API server answered a call with an error status (mapped by ``_api_error``)."""

    def __init__(self, status: int, body: Body, text: str) -> None:
        super().__init__(f"{status}: {text[:200]}")
        self.status = status
        self.body = body
        self.text = text


class Cluster:
    """One API server, one default namespace, and the calls the ops verbs make."""

    def __init__(self, api: SyncClient, *, namespace: str, source: str) -> None:
        self.api = api
        self.namespace = namespace
        self.source = source  # where the connection came from, for messages
        self.server = api.server

    @classmethod
    def connect(
        cls,
        *,
        kubeconfig: str | None = None,
        context: str | None = None,
        namespace: str | None = None,
    ) -> Cluster:
        """Connect as kubectl would: --kubeconfig, else $KUBECONFIG, else ~/.kube/config,
        else the pod's service account. Raises ``OpsError(NO_CLUSTER)`` saying what to do."""
        config = find_config(kubeconfig, context)
        connect, read = REQUEST_TIMEOUT
        return cls(
            SyncClient(config, timeout=connect + read, connect=connect),
            namespace=namespace or config.namespace or "default",
            source=config.source,
        )

    def close(self) -> None:
        self.api.close()

    # -- error mapping -------------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        what: str = "",
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Body:
        """Run one API call; a failure becomes an ``OpsError`` with the right exit code."""
        result = self._try(method, path, body, what=what, params=params, content_type=content_type)
        assert result is not None
        return result

    def _try(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        what: str = "",
        tolerate: tuple[int, ...] = (),
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Body | None:
        """``_call``, but None when the API server answers with a status in ``tolerate``."""
        return self._answer(
            method,
            path,
            body,
            what=what,
            tolerate=tolerate,
            params=params,
            content_type=content_type,
        )[1]

    def _answer(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        what: str = "",
        tolerate: tuple[int, ...] = (),
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, Body | None]:
        """``_try``, with the status the API server answered."""
        for attempt in (1, 2):
            try:
                rsp = self.api.request(
                    method, path, body=body, params=params, content_type=content_type
                )
                if rsp.retry_after is not None and rsp.status in (429, 503) and attempt == 1:
                    # "storage is (re)initializing" just after the CRDs were installed, or
                    # a throttled request: the API server says when to ask again.
                    time.sleep(min(rsp.retry_after, RETRY_AFTER_MAX))
                    continue
                break
            except kube.TransportError as err:
                # One quick retry for a dropped connection; a server that is down fails
                # in seconds.
                if attempt == 1:
                    continue
                raise OpsError(
                    f"cannot reach the API server at {self.server} ({self.source}): {err}. "
                    f"Is the cluster running? {NO_CLUSTER_HINT}",
                    Exit.NO_CLUSTER,
                ) from err
            except kube.CredentialError as err:
                raise OpsError(
                    f"no credentials for the API server at {self.server} ({self.source}): "
                    f"{err}. Log in again or pick another context.",
                    Exit.NO_CLUSTER,
                ) from err
        text = rsp.raw.decode(errors="replace")
        if rsp.ok:
            decoded: Body = json.loads(rsp.raw) if rsp.raw else {}
            return rsp.status, decoded
        if rsp.status in tolerate:
            return rsp.status, None
        try:
            status_body = json.loads(rsp.raw) if rsp.raw else {}
        except ValueError:
            status_body = {}
        raise self._api_error(
            Refused(rsp.status, status_body if isinstance(status_body, dict) else {}, text), what
        )

    def _api_error(self, err: Refused, what: str) -> OpsError:
        return refusal(err.status, err.body, err.text, what, server=self.server, source=self.source)

    # -- reads ---------------------------------------------------------------------------

    def _ns(self, namespace: str | None) -> str:
        return namespace or self.namespace

    def task(self, name: str, namespace: str | None = None) -> Body:
        return self._get(TASK_PLURAL, name, namespace)

    def worker(self, name: str, namespace: str | None = None) -> Body:
        return self._get(WORKER_PLURAL, name, namespace)

    def _get(self, plural: str, name: str, namespace: str | None) -> Body:
        ns = self._ns(namespace)
        return self._call(
            "GET",
            kube.object_path(GROUP, VERSION, ns, plural, name),
            what=f"{plural[:-1]} {name!r} in namespace {ns!r}",
        )

    def _list(
        self, plural: str, namespace: str | None, all_namespaces: bool, selector: str | None
    ) -> list[Body]:
        params = {"labelSelector": selector} if selector else None
        ns = None if all_namespaces else self._ns(namespace)
        listed = self._call("GET", kube.object_path(GROUP, VERSION, ns, plural), params=params)
        items: list[Body] = listed.get("items") or []
        return items

    def tasks(
        self,
        namespace: str | None = None,
        *,
        all_namespaces: bool = False,
        selector: str | None = None,
    ) -> list[Body]:
        return self._list(TASK_PLURAL, namespace, all_namespaces, selector)

    def workers(self, namespace: str | None = None, *, all_namespaces: bool = False) -> list[Body]:
        return self._list(WORKER_PLURAL, namespace, all_namespaces, None)

    def queues(self) -> list[Body] | None:
        """Every AgentQueue (cluster-scoped); None when listing them is forbidden (403),
        which a namespaced role cannot grant: the verbs show the rest and say so. No
        AgentQueue CRD (an older install, 404) is no queues."""
        status, listed = self._answer(
            "GET", kube.object_path(GROUP, VERSION, None, QUEUE_PLURAL), tolerate=(403, 404)
        )
        if listed is None:
            return None if status == 403 else []
        items: list[Body] = listed.get("items") or []
        return items

    def budgets(self) -> list[Body] | None:
        """Every AgentBudget (cluster-scoped); None when listing them is forbidden (403);
        no AgentBudget CRD (404) is no budgets."""
        status, listed = self._answer(
            "GET", kube.object_path(GROUP, VERSION, None, BUDGET_PLURAL), tolerate=(403, 404)
        )
        if listed is None:
            return None if status == 403 else []
        items: list[Body] = listed.get("items") or []
        return items

    def events_of(self, obj: Mapping[str, Any]) -> list[Body]:
        """The core/v1 Events recorded on ``obj`` (matched by UID, so not a namesake's)."""
        meta = obj.get("metadata") or {}
        listed = self._call(
            "GET",
            kube.object_path("", "v1", self._ns(meta.get("namespace")), "events"),
            params={"fieldSelector": f"involvedObject.uid={meta.get('uid')}"},
        )
        events: list[Body] = listed.get("items") or []
        return events

    def events(self, namespace: str | None = None) -> list[Body]:
        """Every core/v1 Event of a namespace (the demo's live feed)."""
        listed = self._call("GET", kube.object_path("", "v1", self._ns(namespace), "events"))
        events: list[Body] = listed.get("items") or []
        return events

    def task_lease(self, task: Mapping[str, Any]) -> Body | None:
        """The claim's Lease ``agentq-task-<task>``, or -- a claim across namespaces
        (``status.workerNamespace``) -- ``agentq-xtask-<namespace>.<task>`` in the
        worker's namespace (None there too when we may not read it); None if not there."""
        meta = task.get("metadata") or {}
        ns = self._ns(meta.get("namespace"))
        worker_ns = _worker_namespace(task)
        if worker_ns is not None and worker_ns != ns:
            return self._try(
                "GET",
                kube.lease_path(
                    worker_ns, protocol.cross_task_lease_name(ns, str(meta.get("name")))
                ),
                what="lease",
                tolerate=(403, 404),
            )
        name = protocol.task_lease_name(str(meta.get("name")))
        return self._try("GET", kube.lease_path(ns, name), what="lease", tolerate=(404,))

    def workers_if_readable(self, namespace: str) -> list[Body] | None:
        """The AgentWorkers of ``namespace``; None when listing them is forbidden (403)."""
        _, listed = self._answer(
            "GET", kube.object_path(GROUP, VERSION, namespace, WORKER_PLURAL), tolerate=(403,)
        )
        if listed is None:
            return None
        items: list[Body] = listed.get("items") or []
        return items

    # -- writes --------------------------------------------------------------------------

    def set_paused(self, name: str, paused: bool, namespace: str | None = None) -> Body:
        """Set ``spec.paused`` of an AgentWorker (the cordon the operator honours)."""
        ns = self._ns(namespace)
        return self._call(
            "PATCH",
            kube.object_path(GROUP, VERSION, ns, WORKER_PLURAL, name),
            {"spec": {"paused": paused}},
            what=f"agentworker {name!r} in namespace {ns!r}",
            content_type=MERGE,
        )

    def request_requeue(self, task: Mapping[str, Any], request: str) -> Body | None:
        """Set the requeue annotation if ``task`` is unchanged since it was read.

        Returns the updated task, or None if it changed meanwhile (409): the caller
        re-reads and decides again, so a task is never requeued on stale evidence.
        A cancelled task's ``spec.cancel`` is set back to false in the same write, or
        the operator would cancel it again at once.
        """
        meta = task.get("metadata") or {}
        patch: Body = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {protocol.ANNOTATION_REQUEUE: request},
            }
        }
        if (task.get("spec") or {}).get("cancel"):
            patch["spec"] = {"cancel": False}
        return self._try(
            "PATCH",
            kube.object_path(
                GROUP, VERSION, self._ns(meta.get("namespace")), TASK_PLURAL, str(meta.get("name"))
            ),
            patch,
            what=f"agenttask {meta.get('name')!r}",
            tolerate=(409,),
            content_type=MERGE,
        )


def _worker_namespace(task: Mapping[str, Any]) -> str | None:
    """A task's ``status.workerNamespace``, if it names one."""
    status = task.get("status")
    value = status.get("workerNamespace") if isinstance(status, Mapping) else None
    return value if isinstance(value, str) and value else None
