"""Exit codes of the ops verbs, and the error that carries one.

Scripts branch on these, so they are part of the interface (documented in
``docs/cli.md``); never renumber them.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import IntEnum


class Exit(IntEnum):
    """The exit codes of the ops verbs (explain, top, drain, uncordon, requeue, submit,
    wait, cancel)."""

    OK = 0
    # The verb ran but did not do all it was asked: a named task was not requeuable,
    # the API server refused a write (RBAC, validation), a write kept conflicting.
    PARTIAL = 1
    # Bad arguments (click's own code for usage errors).
    USAGE = 2
    # No usable cluster: no kubeconfig, API server unreachable, credentials refused,
    # or the agentq CRDs are not installed.
    NO_CLUSTER = 3
    # A named AgentTask or AgentWorker does not exist (``wait``: or it was deleted while
    # waited on; no task matched the selector).
    NOT_FOUND = 4
    # A wait (``drain --wait``, ``wait``, ``submit --wait``) ran out of time; what is
    # still going is printed.
    TIMEOUT = 5
    # ``wait``, ``submit --wait``: a task ended Failed or DeadLettered.
    FAILED = 6
    # ``wait``, ``submit --wait``: a task ended Cancelled.
    CANCELLED = 7
    # Interrupted (Ctrl-C, SIGINT; 128 + 2 as shells report it): the verb stopped where
    # it was; what it had sent stays sent. Never combined with the others.
    INTERRUPTED = 130


# When a verb's tasks end differently, the exit code is the first of these that
# occurred: the most definite bad news wins; a timeout only says "not yet".
# (INTERRUPTED is not an outcome: it ends the verb.)
PRECEDENCE = (
    Exit.NO_CLUSTER,
    Exit.PARTIAL,
    Exit.NOT_FOUND,
    Exit.FAILED,
    Exit.CANCELLED,
    Exit.TIMEOUT,
    Exit.OK,
)


def worst(codes: Iterable[Exit]) -> Exit:
    """The exit code of several outcomes (``PRECEDENCE``); OK for none."""
    seen = set(codes)
    return next((code for code in PRECEDENCE if code in seen), Exit.OK)


class OpsError(Exception):
    """An error a user can act on: the message says what happened and what to do.

    The commands print it as ``error: <message>`` on stderr and exit with ``code``.
    """

    def __init__(self, message: str, code: Exit = Exit.PARTIAL) -> None:
        super().__init__(message)
        self.code = code
