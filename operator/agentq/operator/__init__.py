"""The agentq operator: thin Kubernetes glue around the pure core.

- ``config``: settings from flags and environment, each with its default.
- ``store``: the in-memory mirror of AgentTasks, AgentWorkers and Leases, fed by watches.
- ``kube``: the only module that calls the API server (in threads, off the event loop).
- ``controller``: one loop, in numbered steps, that decides and commits transitions.
- ``leader``: Lease-based leader election, so only one replica decides.
- ``metrics``: Prometheus metrics.
- ``handlers``: the kopf watch handlers that feed the store.
- ``main`` / ``command``: wiring, and the ``agentq operator`` CLI.
"""
