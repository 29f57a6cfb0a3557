"""Day-to-day operation of agentq from the command line: the ``agentq`` /
``kubectl agentq`` verbs ``explain``, ``top``, ``drain``, ``uncordon`` and ``requeue``.

One job per module:

- ``errors``:   exit codes scripts can rely on, and the error type that carries one;
- ``kube``:     the only module that talks to the API server (the sync client; a CLI
                needs neither threads nor async) -- a narrow seam, so everything
                below is testable without a cluster;
- ``explain``:  why a task is where it is (pure: task, workers, events, Lease -> findings);
- ``fleet``:    the per-worker and per-queue view behind ``top`` and the demo (pure);
- ``redrive``:  which tasks a ``requeue`` selects, and its pacing (pure);
- ``render``:   text, JSON and YAML output (rich for people, plain data for scripts);
- ``commands``: the click commands, thin glue over the above.
"""
