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
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import urllib3
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException

from agentq import GROUP, VERSION, protocol
from agentq.models import TASK_PLURAL, WORKER_PLURAL
from agentq.ops.errors import Exit, OpsError

Body = dict[str, Any]
T = TypeVar("T")

# (connect, read) seconds: a CLI should fail in seconds, not hang, when the server is gone.
REQUEST_TIMEOUT = (5.0, 30.0)
MERGE = "application/merge-patch+json"
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


def _kubeconfig_files(explicit: str | None) -> list[Path]:
    raw = explicit or os.environ.get("KUBECONFIG") or "~/.kube/config"
    return [Path(p).expanduser() for p in raw.split(os.pathsep) if p]


class Cluster:
    """One API server, one default namespace, and the calls the ops verbs make."""

    def __init__(self, api: client.ApiClient, *, namespace: str, source: str) -> None:
        self.api = api
        self.namespace = namespace
        self.source = source  # where the connection came from, for messages
        self.server = str(api.configuration.host)
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.leases = client.CoordinationV1Api(api)

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
        configuration = client.Configuration()
        files = _kubeconfig_files(kubeconfig)
        in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        default_ns: str | None = None
        if not any(f.exists() for f in files):
            if in_pod and kubeconfig is None and context is None:
                try:
                    config.load_incluster_config(client_configuration=configuration)
                except ConfigException as err:
                    raise OpsError(
                        f"cannot use the pod's service account: {err}", Exit.NO_CLUSTER
                    ) from err
                source = "the pod's service account"
                if SERVICE_ACCOUNT_NAMESPACE.exists():
                    default_ns = SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or None
            else:
                shown = os.pathsep.join(str(f) for f in files)
                raise OpsError(
                    f"no kubeconfig found (looked for {shown}). {NO_CLUSTER_HINT}",
                    Exit.NO_CLUSTER,
                )
        else:
            shown = os.pathsep.join(str(f) for f in files if f.exists())
            try:
                config.load_kube_config(
                    config_file=kubeconfig,
                    context=context,
                    client_configuration=configuration,
                    persist_config=False,
                )
                contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
            except (ConfigException, OSError, ValueError, TypeError) as err:
                raise OpsError(
                    f"cannot use kubeconfig {shown}: {err}. {NO_CLUSTER_HINT}", Exit.NO_CLUSTER
                ) from err
            chosen = next((c for c in contexts if c.get("name") == context), None) or active
            default_ns = ((chosen or {}).get("context") or {}).get("namespace")
            source = f"kubeconfig {shown}, context {(chosen or {}).get('name', '?')}"
        # One quick retry for a dropped connection; a server that is down fails in seconds.
        configuration.retries = 1
        return cls(
            client.ApiClient(configuration),
            namespace=namespace or default_ns or "default",
            source=source,
        )

    def close(self) -> None:
        self.api.close()

    # -- error mapping -------------------------------------------------------------------

    def _call(self, call: Callable[..., T], *args: Any, what: str = "", **kwargs: Any) -> T:
        """Run one API call; a failure becomes an ``OpsError`` with the right exit code."""
        result = self._try(call, *args, what=what, **kwargs)
        assert result is not None
        return result

    def _try(
        self,
        call: Callable[..., T],
        *args: Any,
        what: str = "",
        tolerate: tuple[int, ...] = (),
        **kwargs: Any,
    ) -> T | None:
        """``_call``, but None when the API server answers with a status in ``tolerate``."""
        try:
            return call(*args, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        except ApiException as err:
            if err.status in tolerate:
                return None
            raise self._api_error(err, what) from err
        except (urllib3.exceptions.HTTPError, OSError) as err:
            reason = getattr(err, "reason", None) or err
            raise OpsError(
                f"cannot reach the API server at {self.server} ({self.source}): {reason}. "
                f"Is the cluster running? {NO_CLUSTER_HINT}",
                Exit.NO_CLUSTER,
            ) from err

    def _api_error(self, err: ApiException, what: str) -> OpsError:
        try:
            status: Body = json.loads(err.body or "{}")
        except ValueError:
            status = {}
        if not isinstance(status, dict):
            status = {}
        message = status.get("message") or err.reason or "no message"
        if err.status == 404:
            if (status.get("details") or {}).get("name"):
                return OpsError(f"{what or 'object'} not found: {message}", Exit.NOT_FOUND)
            return OpsError(f"{NO_CRDS_HINT} (API server: {message})", Exit.NO_CLUSTER)
        if err.status == 401:
            return OpsError(
                f"the API server at {self.server} refused our credentials ({self.source}): "
                f"{message}. Log in again or pick another context.",
                Exit.NO_CLUSTER,
            )
        if err.status == 403:
            return OpsError(
                f"forbidden: {message}. The ops verbs need get/list on agenttasks, "
                "agentworkers, leases and events, and patch on agenttasks (requeue) and "
                "agentworkers (drain, uncordon); see docs/cli.md#permissions.",
                Exit.PARTIAL,
            )
        return OpsError(f"the API server refused: {err.status} {message}", Exit.PARTIAL)

    # -- reads ---------------------------------------------------------------------------

    def _ns(self, namespace: str | None) -> str:
        return namespace or self.namespace

    def task(self, name: str, namespace: str | None = None) -> Body:
        return self._get(TASK_PLURAL, name, namespace)

    def worker(self, name: str, namespace: str | None = None) -> Body:
        return self._get(WORKER_PLURAL, name, namespace)

    def _get(self, plural: str, name: str, namespace: str | None) -> Body:
        ns = self._ns(namespace)
        got: Body = self._call(
            self.custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            ns,
            plural,
            name,
            what=f"{plural[:-1]} {name!r} in namespace {ns!r}",
        )
        return got

    def _list(
        self, plural: str, namespace: str | None, all_namespaces: bool, selector: str | None
    ) -> list[Body]:
        kwargs: dict[str, Any] = {"label_selector": selector} if selector else {}
        if all_namespaces:
            listed = self._call(
                self.custom.list_cluster_custom_object, GROUP, VERSION, plural, **kwargs
            )
        else:
            listed = self._call(
                self.custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                self._ns(namespace),
                plural,
                **kwargs,
            )
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

    def events_of(self, obj: Mapping[str, Any]) -> list[Body]:
        """The core/v1 Events recorded on ``obj`` (matched by UID, so not a namesake's)."""
        meta = obj.get("metadata") or {}
        listed = self._call(
            self.core.list_namespaced_event,
            self._ns(meta.get("namespace")),
            field_selector=f"involvedObject.uid={meta.get('uid')}",
        )
        events: list[Body] = self.api.sanitize_for_serialization(listed.items)
        return events

    def events(self, namespace: str | None = None) -> list[Body]:
        """Every core/v1 Event of a namespace (the demo's live feed)."""
        listed = self._call(self.core.list_namespaced_event, self._ns(namespace))
        events: list[Body] = self.api.sanitize_for_serialization(listed.items)
        return events

    def task_lease(self, task: Mapping[str, Any]) -> Body | None:
        """The claim's Lease ``agentq-task-<task>``, or None."""
        meta = task.get("metadata") or {}
        lease = self._try(
            self.leases.read_namespaced_lease,
            protocol.task_lease_name(str(meta.get("name"))),
            self._ns(meta.get("namespace")),
            what="lease",
            tolerate=(404,),
        )
        if lease is None:
            return None
        body: Body = self.api.sanitize_for_serialization(lease)
        return body

    # -- writes --------------------------------------------------------------------------

    def set_paused(self, name: str, paused: bool, namespace: str | None = None) -> Body:
        """Set ``spec.paused`` of an AgentWorker (the cordon the operator honours)."""
        ns = self._ns(namespace)
        updated: Body = self._call(
            self.custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            ns,
            WORKER_PLURAL,
            name,
            {"spec": {"paused": paused}},
            what=f"agentworker {name!r} in namespace {ns!r}",
            _content_type=MERGE,
        )
        return updated

    def request_requeue(self, task: Mapping[str, Any], request: str) -> Body | None:
        """Set the requeue annotation if ``task`` is unchanged since it was read.

        Returns the updated task, or None if it changed meanwhile (409): the caller
        re-reads and decides again, so a task is never requeued on stale evidence.
        """
        meta = task.get("metadata") or {}
        patch = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {protocol.ANNOTATION_REQUEUE: request},
            }
        }
        updated: Body | None = self._try(
            self.custom.patch_namespaced_custom_object,
            GROUP,
            VERSION,
            self._ns(meta.get("namespace")),
            TASK_PLURAL,
            meta.get("name"),
            patch,
            what=f"agenttask {meta.get('name')!r}",
            tolerate=(409,),
            _content_type=MERGE,
        )
        return updated
