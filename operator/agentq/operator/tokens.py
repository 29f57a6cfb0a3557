"""Fencing tokens from one cluster-wide monotonic counter, reserved in blocks (hi/lo).

The durable counter is an annotation (``agentq.dev/token-ceiling``) on a Lease
in the leader's namespace: the highest token any operator may have issued. A
leader reserves the next ``block`` tokens with one compare-and-swap write of
that ceiling, then hands them out from memory, so a grant costs no extra write
(one per ``block`` grants). Every block starts above both the durable ceiling
and every token the operator has seen in a task status (``observe``), so a
token is strictly greater than every token issued before for any task -- also
for a task deleted and re-created under the same name, whose zombie may still
hold an old one (``agentq.claims.reserve_tokens``).

A new leader starts a new block: it never reuses the old leader's remainder.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from agentq import GROUP, claims, protocol
from agentq.clock import Clock, micro_rfc3339
from agentq.operator.port import Kube, KubeError, Status

log = logging.getLogger("agentq.tokens")
ANNOTATION_CEILING = f"{GROUP}/token-ceiling"


class TokenAllocator:
    def __init__(
        self, kube: Kube, clock: Clock, *, namespace: str, name: str, block: int = 1000
    ) -> None:
        self.kube = kube
        self.clock = clock
        self.namespace = namespace
        self.name = name
        self.block = block
        self.floor = 0  # the highest token seen in any task status
        self._next = 1
        self._last = 0  # the current block is [_next, _last]; empty when _next > _last
        self._refill: asyncio.Task[None] | None = None
        # The highest token any operator may have issued (the durable ceiling as of our
        # last reservation); None until then. A status token above it was written by
        # someone else: it must not drag every later token up (``forged``).
        self.issued: int | None = None

    def observe(self, token: int | None) -> None:
        """A token seen in a task status: every later block starts above it (unless it is
        above every token issued: forged, ignored)."""
        if token is None or token <= self.floor or self.forged(token):
            return
        self.floor = token

    def forged(self, token: int) -> bool:
        """Above every token any operator issued: written by someone else."""
        return self.issued is not None and token > self.issued

    def reset(self) -> None:
        """Forget the current block (leadership changed hands), and what we knew of the
        durable ceiling: another replica may have led meanwhile and granted from a block
        above it. Until our next reservation reads the counter again no token is judged
        forged (``forged`` needs a ceiling we know to be current)."""
        self._next, self._last = 1, 0
        self.issued = None

    @property
    def available(self) -> int:
        return max(0, self._last - self._next + 1)

    def ready(self, above: int) -> bool:
        """Whether ``take(above)`` would give a token: ask before deciding a grant, take
        once it is decided (a pass that grants nothing must not use up the block)."""
        if self._next <= above:
            # Someone raised a status' token by hand past our block: skip past it.
            self.floor = max(self.floor, above)
            self._next = self._last + 1
        return self.available > 0

    def take(self, above: int) -> int | None:
        """The next token above ``above`` (the task's current one), or None when the block
        is used up (the caller runs ``refill``)."""
        if not self.ready(above):
            return None
        token = self._next
        self._next += 1
        return token

    def wants_refill(self) -> bool:
        # Only when empty: a block reserved while the old one still has tokens could leave
        # a gap another leader reserved in between, and the two must never mix.
        return self.available == 0

    async def refill(self) -> None:
        """Reserve the next block with one CAS write of the durable ceiling."""
        for _ in range(5):
            got = await self.kube.get_lease(self.namespace, self.name)
            now = micro_rfc3339(self.clock.now())
            if got.status is Status.GONE:
                first, last = claims.reserve_tokens(0, self.floor, self.block)
                body: dict[str, Any] = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {
                        "name": self.name,
                        "namespace": self.namespace,
                        "annotations": {ANNOTATION_CEILING: str(last)},
                    },
                    "spec": {"renewTime": now},
                }
                reply = await self.kube.create_lease(self.namespace, body)
            elif got.ok and got.body is not None:
                body = got.body
                meta: dict[str, Any] = body.setdefault("metadata", {})
                annotations: dict[str, str] = meta.get("annotations") or {}
                meta["annotations"] = annotations
                ceiling = protocol.parse_token(annotations.get(ANNOTATION_CEILING)) or 0
                floor = self.floor
                if floor > ceiling:
                    # Every token issued is at most the ceiling: one above it in a status
                    # was written by someone else. Not followed (it could be 2^63-1).
                    log.warning(
                        "a task status shows fencing token %d, above every token issued (%d):"
                        " ignored",
                        floor,
                        ceiling,
                    )
                    self.floor = floor = ceiling
                first, last = claims.reserve_tokens(ceiling, floor, self.block)
                annotations[ANNOTATION_CEILING] = str(last)
                body.setdefault("spec", {})["renewTime"] = now
                reply = await self.kube.replace_lease(self.namespace, self.name, body)
            else:
                raise KubeError(f"cannot read the token counter: {got.status} {got.message}")
            if reply.ok:
                self._next, self._last = first, last
                self.issued = last
                log.info("reserved fencing tokens %d..%d", first, last)
                return
            if reply.status is not Status.CONFLICT:
                raise KubeError(f"cannot reserve tokens: {reply.status} {reply.message}")
        raise KubeError("the token counter kept changing under us")
