"""agentq's one Kubernetes client, for operator, sidecar and CLI.

- ``config``: where the API server is and who we are (kubeconfig, the pod's account);
- ``credentials``: tokens, token files, exec plugins, kept fresh;
- ``client``: requests and watches over aiohttp, a 401 answered by refreshing once;
- ``sync``: the same for the synchronous CLI;
- ``backoff``: the one retry delay.

Why this client and not another: docs/benchmarks.md ("One Kubernetes client").
"""

from agentq.kube.backoff import Backoff
from agentq.kube.client import (
    MERGE_PATCH,
    Client,
    Response,
    Stream,
    TransportError,
    lease_path,
    object_path,
)
from agentq.kube.config import ConfigError, KubeConfig, from_kubeconfig, in_cluster, load
from agentq.kube.credentials import Auth, CredentialError, Credentials, ExecPlugin

__all__ = [
    "MERGE_PATCH",
    "Auth",
    "Backoff",
    "Client",
    "ConfigError",
    "CredentialError",
    "Credentials",
    "ExecPlugin",
    "KubeConfig",
    "Response",
    "Stream",
    "TransportError",
    "from_kubeconfig",
    "in_cluster",
    "lease_path",
    "load",
    "object_path",
]
