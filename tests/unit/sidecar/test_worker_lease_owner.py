"""The worker Lease names its registered AgentWorker its owner, and drops it when the
Lease is deleted under it (perhaps by the garbage collector, that owner gone)."""

from __future__ import annotations

import copy
from typing import Any

from agentq.clock import FakeClock
from agentq.sidecar.kubeapi import ApiError
from agentq.sidecar.worker_lease import WorkerLeaseKeeper
from harness import run

OWNER = {"apiVersion": "agentq.dev/v1alpha1", "kind": "AgentWorker", "name": "w", "uid": "u-1"}


class _Leases:
    """One Lease in memory: GET, POST, PUT (with resourceVersion), and deletion."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.rv = 0
        self.writes: list[dict[str, Any]] = []

    async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        if method == "GET":
            if self.lease is None:
                raise ApiError(404, "not found")
            return copy.deepcopy(self.lease)
        body = copy.deepcopy(kw["body"])
        if method == "PUT" and self.lease is None:
            raise ApiError(404, "not found")
        self.rv += 1
        body["metadata"]["resourceVersion"] = str(self.rv)
        self.lease = body
        self.writes.append(body)
        return copy.deepcopy(body)


def _keeper(api: _Leases) -> WorkerLeaseKeeper:
    return WorkerLeaseKeeper(
        api,  # type: ignore[arg-type]
        FakeClock(),
        namespace="ns",
        worker="w",
        identity="w-pod",
        duration_seconds=15,
        on_acquired=lambda rv: None,
        on_lost=lambda reason: None,
    )


@run
async def test_the_registered_agent_worker_owns_the_lease_from_the_next_write() -> None:
    api = _Leases()
    keeper = _keeper(api)
    await keeper.step()  # created before the registration is done: no owner yet
    assert "ownerReferences" not in api.writes[-1]["metadata"]
    keeper.own_by(OWNER)
    await keeper.step()  # the renewal names it
    assert api.writes[-1]["metadata"]["ownerReferences"] == [OWNER]
    assert api.writes[-1]["spec"]["holderIdentity"] == "w-pod"
    await keeper.step()
    assert api.writes[-1]["metadata"]["ownerReferences"] == [OWNER]
    # Another registration's AgentWorker (a worker deleted and made again) replaces it.
    again = {**OWNER, "uid": "u-2"}
    keeper.own_by(again)
    await keeper.step()
    assert api.writes[-1]["metadata"]["ownerReferences"] == [again]


@run
async def test_a_lease_deleted_under_the_keeper_is_made_again_without_the_owner() -> None:
    api = _Leases()
    keeper = _keeper(api)
    keeper.own_by(OWNER)
    await keeper.step()
    assert api.writes[-1]["metadata"]["ownerReferences"] == [OWNER]
    api.lease = None  # the garbage collector: its AgentWorker was deleted
    await keeper.step()  # the renewal finds it gone
    assert not keeper.holding
    await keeper.step()  # made again, not owned by the AgentWorker that went
    assert keeper.holding
    assert "ownerReferences" not in api.writes[-1]["metadata"]
