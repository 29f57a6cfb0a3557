"""The embedded control plane: a local etcd, kube-apiserver and kube-controller-manager.

No Docker and no kubelet: the same shape as controller-runtime's envtest, plus the
controller manager so that garbage collection, namespace deletion and
service-account tokens work. Used by ``make demo`` and the integration tests.

- ``versions``: the pinned Kubernetes and etcd versions.
- ``binaries``: finds the binaries (KUBEBUILDER_ASSETS, PATH, cache) or builds them.
- ``pki``: the certificates, keys and admin kubeconfig.
- ``cluster``: starts, checks and stops the processes (by pid, never by name).
- ``command``: the ``agentq cluster`` CLI.
"""

from agentq.controlplane.cluster import Cluster, ClusterError, ClusterState

__all__ = ["Cluster", "ClusterError", "ClusterState"]
