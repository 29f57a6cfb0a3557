"""agentq: a fair-share task queue for fleets of AI agents, as a Kubernetes operator.

The contract (names, resources, behaviour) is in the project's DESIGN notes and
``docs/``. Subpackages own one job each:

- ``agentq.scheduler``: the pure dispatch core (weighted deficit round-robin).
- ``agentq.controlplane``: the embedded etcd + kube-apiserver used by the demo and tests.
- ``agentq.cli``: the ``agentq`` / ``kubectl agentq`` command line.
"""

__version__ = "0.1.0"

GROUP = "agentq.dev"
VERSION = "v1alpha1"
