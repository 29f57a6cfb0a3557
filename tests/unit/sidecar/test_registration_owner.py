"""A pool's worker (its pod's name) registers an AgentWorker the pod owns."""

from __future__ import annotations

import asyncio
from typing import Any

from agentq.sidecar.kubeapi import ApiError
from agentq.sidecar.registration import register
from harness import run


class _Api:
    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []

    async def request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        if method == "GET":
            raise ApiError(404, "not found")
        self.created.append(kw["body"])
        return kw["body"]


@run
async def test_the_registered_worker_is_owned_by_its_pod_when_asked() -> None:
    api = _Api()
    owner = {"apiVersion": "v1", "kind": "Pod", "name": "pool-abc", "uid": "u-1"}
    ok = await register(
        api,  # type: ignore[arg-type]
        namespace="ns",
        worker="pool-abc",
        spec={"capabilities": ["llm"]},
        stop=asyncio.Event(),
        owner=owner,
    )
    assert ok and api.created[0]["metadata"]["ownerReferences"] == [owner]
    plain = _Api()
    assert await register(
        plain,  # type: ignore[arg-type]
        namespace="ns",
        worker="w",
        spec={"capabilities": ["llm"]},
        stop=asyncio.Event(),
    )
    assert "ownerReferences" not in plain.created[0]["metadata"]
