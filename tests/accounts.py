"""Acting as a ServiceAccount on the real API server: TokenRequest tokens, bound to
a Pod object when asked (the token then carries the pod's name and UID, as a
kubelet-mounted token does), and kubeconfigs and API clients that use them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException


def create_account(core: client.CoreV1Api, namespace: str, name: str) -> None:
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
    )


def bound_pod(core: client.CoreV1Api, namespace: str, account: str, name: str) -> Any:
    """A Pod object running as ``account`` (never scheduled without a node), to bind to."""
    return core.create_namespaced_pod(
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1PodSpec(
                service_account_name=account,
                containers=[client.V1Container(name="c", image="agentq.local/pause:1")],
            ),
        ),
    )


def token(
    core: client.CoreV1Api,
    namespace: str,
    account: str,
    *,
    pod: Any | None = None,
    audiences: list[str] | None = None,
) -> str:
    """A TokenRequest token of ``account``, bound to ``pod`` if given; for ``audiences``
    if given, else the API server's own."""
    bound = (
        client.V1BoundObjectReference(
            api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid
        )
        if pod is not None
        else None
    )
    review = core.create_namespaced_service_account_token(
        account,
        namespace,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=audiences or [], expiration_seconds=3600, bound_object_ref=bound
            )
        ),
    )
    return str(review.status.token)


def kubeconfig_for_token(admin_kubeconfig: str, token: str, path: Path) -> Path:
    """A copy of the admin kubeconfig whose user is the bearer ``token`` instead."""
    config = yaml.safe_load(Path(admin_kubeconfig).read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def api_for_token(admin_kubeconfig: str, token: str) -> client.ApiClient:
    """An API client that authenticates with ``token`` only (no client certificate)."""
    from kubernetes import config as kube_config

    configuration = client.Configuration()
    kube_config.load_kube_config(config_file=admin_kubeconfig, client_configuration=configuration)
    configuration.cert_file = None
    configuration.key_file = None
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(configuration)


def refused(call: Callable[[], Any], *, by: str, says: str = "") -> str:
    """The API server refuses ``call`` (403), ``by`` (an admission policy, or RBAC's
    "cannot") and saying ``says``: returns the refusal's body."""
    with pytest.raises(ApiException) as err:
        call()
    body = str(err.value.body)
    assert err.value.status == 403, body
    assert by in body, body
    assert says in body, body
    return body
