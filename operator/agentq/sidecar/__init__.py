"""``agentq sidecar``: the only process in an agent pod that talks to Kubernetes.

It keeps the worker's Lease (the worker's readiness), watches the task Leases
the operator grants to the worker, and serves the agent a small HTTP API on
loopback (``docs/agent-api.md``). It renews a task's Lease only while the agent
keeps beating for that task, with one API request per renewal.

One job per module:

- ``kubeapi``      a thin async Kubernetes REST client (aiohttp) that counts its requests
- ``attempts``     the pure core: which attempts this worker holds, when each is renewed
- ``worker_lease`` keeps (and on shutdown releases) the worker Lease ``agentq-worker-<name>``
- ``watcher``      one watch of the worker's task Leases; reads each task's payload
- ``renewer``      the renewal loop and the Lease writes (renewal, report)
- ``api``          the agent's HTTP API
- ``registration`` creates or updates the AgentWorker from flags
- ``command``      the ``agentq sidecar`` command: wiring, signals, shutdown
"""
