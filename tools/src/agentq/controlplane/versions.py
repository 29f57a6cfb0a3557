"""The pinned versions of the embedded control plane.

They must match ``e2e/controlplane/kubernetes/go.mod``,
``e2e/controlplane/etcd/go.mod``, ``e2e/controlplane/helm/go.mod`` and
``e2e/controlplane/keda/VERSION`` (a unit test checks it): the Go wrapper
modules are what gets built, these constants are what gets looked for.
"""

KUBERNETES_VERSION = "v1.36.5"
# The etcd release Kubernetes v1.36 ships with (its go.mod requires etcd v3.6.8).
ETCD_VERSION = "v3.6.8"
# Helm, for charts/agentq's tests and `make e2e` (not the control plane's: its own set).
HELM_VERSION = "v4.3.2"
# KEDA, for autoscaling an agent pool (e2e/test_keda.py, docs/autoscaling.md).
KEDA_VERSION = "v2.21.0"

# Binaries the control plane needs, each with the argument that prints its version.
BINARIES: dict[str, tuple[str, ...]] = {
    "etcd": ("--version",),
    "kube-apiserver": ("--version",),
    "kube-controller-manager": ("--version",),
    "kubectl": ("version", "--client"),
}

# What the local node (``agentq cluster up --node``) adds, built by the same
# wrapper module into a cache directory of its own: the kubelet, the scheduler
# and the pod sandbox program (``e2e/controlplane/pause``).
NODE_BINARIES: dict[str, tuple[str, ...]] = {
    "kubelet": ("--version",),
    "kube-scheduler": ("--version",),
    "pause": ("-version",),
}
PAUSE_VERSION = "agentq-pause 1"

# Helm, built by the same script into a cache directory of its own.
HELM_BINARIES: dict[str, tuple[str, ...]] = {"helm": ("version",)}

# KEDA's operator and metrics adapter, built from its module (not a wrapper module:
# its go.mod's replace directives only apply in its own tree) into a cache directory of
# their own, with KEDA's CRDs beside them (crd/). Never taken from PATH.
KEDA_BINARIES: dict[str, tuple[str, ...]] = {"keda-operator": (), "keda-adapter": ()}


def expected_version(binary: str) -> str:
    """The version string ``binary``'s version output must contain."""
    if binary == "etcd":
        return ETCD_VERSION.removeprefix("v")
    if binary == "pause":
        return PAUSE_VERSION
    if binary == "helm":
        return f'Version:"{HELM_VERSION}"'
    return KUBERNETES_VERSION
