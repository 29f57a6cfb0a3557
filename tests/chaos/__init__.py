"""The chaos suite: a seeded, reproducible fault-injection run of agentq on the
embedded control plane.

- ``plan``     the pure part: the workload (workers, tasks, the poison set) and the
               fault schedule, both derived from one seed;
- ``agents``   how an agent pod is started (the one place that knows which processes
               make up an agent: scripted agent now, sidecar + agent-sim later);
- ``observe``  a watch of every task that checks invariants on every state it sees
               (maxInFlight, tokens, double commits) and records each claim's life;
- ``harness``  starts the cluster, the fleet and two operator replicas, injects the
               faults, waits for the end and verifies (``ChaosRun``);
- ``report``   the summary table (printed, and written into docs/reliability.md);
- ``__main__`` the command line behind ``make chaos``.

Run: ``make chaos`` (1,000 tasks) or ``PYTHONPATH=tests python -m chaos --help``.
"""
