"""A writer process for the concurrent FencedStore property tests.

``run_writer`` opens its own connection to the store (as a separate agent
process would), waits for a common start time so the writers overlap, applies
its operations in order and returns what each one did. It lives outside the
test module so a spawned process can import it.
"""

from __future__ import annotations

import time
from typing import Any

from agentq.fencing import StaleTokenError, open_store

# (kind, key, token, value) -> (kind, key, token, value, accepted, revision or highest)
Op = tuple[str, str, int, Any]
Outcome = tuple[str, str, int, Any, bool, int]


def run_writer(url: str, options: dict[str, Any], ops: list[Op], start_at: float) -> list[Outcome]:
    out: list[Outcome] = []
    with open_store(url, **options) as store:
        time.sleep(max(0.0, start_at - time.time()))
        for kind, key, token, value in ops:
            try:
                if kind == "write":
                    record = store.write(key, token, value)
                else:
                    record = store.fence(key, token)
            except StaleTokenError as err:
                assert err.token == token and err.key == key
                out.append((kind, key, token, value, False, err.highest))
            else:
                out.append((kind, key, token, value, True, record.revision))
    return out
