"""Confirming expiries in batches: one read answers every expiry of a worker's claims.

A stalled watch looks exactly like a dead holder, so an expiry is committed only
after the Lease is read again and found unchanged (``commit.Committer``). When a
worker dies, every claim it held expires within the same second; a GET per Lease
would put hundreds of reads in front of the reclaims' own writes. Instead the
reads of one worker's task Leases are coalesced:

- the first expiry of (namespace, worker label) opens a batch and queues its read
  for a decision slot; expiries of the same worker asked before the read is *sent*
  join it;
- one read per worker at a time: while a worker's read is out, its next expiries
  gather in a new batch, sent when the read returns. Nothing waits on a timer (an
  expiry alone is read at once), and the busier the API server, the larger the
  batches: a dead worker's claims, which expire over the second its last renewals
  were spread over, are read with a few LISTs instead of a GET each;
- one expiry alone is read with a GET (exact, the cheapest); two or more with one
  LIST by label selector (``agentq.dev/lease=task,agentq.dev/worker=W``) when they
  are at least a sixteenth of the worker's claims (else a GET each, in one slot: a
  worker with 1,000 claims of which 3 expire is not listed whole);
- a LIST is a consistent read sent after every request of the batch was made, so it
  is as good a confirmation as a GET for each: what it shows is at least as new as
  what the decision saw. A Lease it does not show (deleted, or relabelled) is read
  alone with a GET;
- a failed LIST falls back to a GET per Lease; a read's failure is the caller's,
  exactly as a GET's would be.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from agentq import protocol
from agentq.operator.cores import Cores
from agentq.operator.gate import RequestGate
from agentq.operator.port import Kube, Reply, Status
from agentq.operator.work import Stats
from agentq.views import LeaseView

log = logging.getLogger("agentq.controller")

BatchKey = tuple[str, str]  # (namespace, worker label)
LIST_SHARE = 16  # a LIST when the expiries asked are at least 1/LIST_SHARE of the claims


@dataclass
class _Batch:
    done: asyncio.Future[dict[str, Reply]]
    names: set[str] = field(default_factory=set)


class ExpiryConfirmer:
    """Reads Leases again for expiries, one request per worker at a time (see module doc)."""

    def __init__(self, *, gate: RequestGate, kube: Kube, cores: Cores, stats: Stats) -> None:
        self.gate = gate
        self.kube = kube
        self.cores = cores
        self.stats = stats
        self._open: dict[BatchKey, _Batch] = {}  # expiries gathering for the next read
        self._sending: dict[BatchKey, asyncio.Task[None]] = {}  # each worker's read

    async def read(self, lease: LeaseView) -> Reply:
        """The Lease as the API server has it now (a GET's reply for this one Lease)."""
        self.stats.confirm_reads += 1
        if not lease.worker_label:
            return await self.gate.call(self.kube.get_lease, lease.namespace, lease.name)
        key = (lease.namespace, lease.worker_label)
        batch = self._open.get(key)
        if batch is None:
            batch = _Batch(asyncio.get_running_loop().create_future())
            batch.done.add_done_callback(_retrieve)
            self._open[key] = batch
        sender = self._sending.get(key)
        if sender is None or sender.done():
            # In flight is judged by the task, not a flag its body clears: a read
            # cancelled before it ran (leadership lost) left its batch here unsent.
            self._sending[key] = self.gate.spawn(self._send(key))
        batch.names.add(lease.name)
        replies = await asyncio.shield(batch.done)
        reply = replies.get(lease.name)
        if reply is not None:
            return reply
        return await self.gate.call(self.kube.get_lease, lease.namespace, lease.name)

    async def _send(self, key: BatchKey) -> None:
        namespace, worker = key
        batch: _Batch | None = None
        try:
            async with self.gate.sending("confirming expiries"):
                # From here on nobody joins: the read goes out after every request in it.
                batch = self._open.pop(key)
                replies: dict[str, Reply] = {}
                if self._worth_a_list(namespace, worker, len(batch.names)):
                    self.stats.confirm_lists += 1
                    listed = await self.kube.list_leases(namespace, selector(worker))
                    replies = found(listed, batch.names)
                else:
                    for name in sorted(batch.names):
                        replies[name] = await self.kube.get_lease(namespace, name)
        except asyncio.CancelledError:
            for pending in (batch, self._open.pop(key, None)):
                if pending is not None:
                    pending.done.cancel()
            raise
        except Exception as err:  # every waiter gets the outcome, as from its own GET
            if batch is None:
                batch = self._open.pop(key, None)
            if batch is not None:
                batch.done.set_exception(err)
        else:
            if batch is not None:
                batch.done.set_result(replies)
        if key in self._open:  # what gathered while this read was out
            self._sending[key] = self.gate.spawn(self._send(key))
        else:
            del self._sending[key]

    def _worth_a_list(self, namespace: str, worker: str, asked: int) -> bool:
        """A LIST returns every claim of the worker: worth it for two expiries or more,
        and when they are at least a sixteenth of its claims (a worker with 1,000 claims
        of which 3 expire is read with 3 GETs, not a LIST of 1,000)."""
        if asked < 2:
            return False
        scheduler = self.cores.get(namespace)
        if scheduler is None or not scheduler.has_worker(worker):
            return True  # its claims are not counted here: one LIST is the safe bet
        return asked * LIST_SHARE >= scheduler.worker_state(worker).in_flight


def selector(worker_label: str) -> str:
    return (
        f"{protocol.LABEL_LEASE_KIND}={protocol.LEASE_KIND_TASK},"
        f"{protocol.LABEL_WORKER}={worker_label}"
    )


def found(listed: Reply, names: set[str]) -> dict[str, Reply]:
    """The replies a GET of each of ``names`` would have given, from one LIST's reply;
    a name it does not answer for is left out (read alone)."""
    if not listed.ok or listed.body is None:
        log.info("confirming expiries by LIST failed (%s); reading each", listed.message)
        return {}
    replies: dict[str, Reply] = {}
    for item in listed.body.get("items") or []:
        name = (item.get("metadata") or {}).get("name")
        if name in names:
            replies[name] = Reply(Status.OK, item)
    return replies


def _retrieve(future: asyncio.Future[dict[str, Reply]]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: every waiter may have gone


__all__ = ["ExpiryConfirmer", "found", "selector"]
