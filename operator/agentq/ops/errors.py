"""Exit codes of the ops verbs, and the error that carries one.

Scripts branch on these, so they are part of the interface (documented in
``docs/cli.md``); never renumber them.
"""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    """``agentq explain|top|drain|uncordon|requeue`` exit codes."""

    OK = 0
    # The verb ran but did not do all it was asked: a named task was not requeuable,
    # the API server refused a write (RBAC, validation), a write kept conflicting.
    PARTIAL = 1
    # Bad arguments (click's own code for usage errors).
    USAGE = 2
    # No usable cluster: no kubeconfig, API server unreachable, credentials refused,
    # or the agentq CRDs are not installed.
    NO_CLUSTER = 3
    # A named AgentTask or AgentWorker does not exist.
    NOT_FOUND = 4
    # A wait (``drain --wait``) ran out of time; what is still held is printed.
    TIMEOUT = 5


class OpsError(Exception):
    """An error a user can act on: the message says what happened and what to do.

    The commands print it as ``error: <message>`` on stderr and exit with ``code``.
    """

    def __init__(self, message: str, code: Exit = Exit.PARTIAL) -> None:
        super().__init__(message)
        self.code = code
