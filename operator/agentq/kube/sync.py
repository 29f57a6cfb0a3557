"""The same client for synchronous callers (the CLI): a private event loop per client.

A command line does one thing at a time; it gets ``Client``'s credentials, 401
handling and errors unchanged, each call run to completion on a loop of its
own (never the caller's: there is none).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from agentq.kube.client import Client, Response
from agentq.kube.config import KubeConfig


class SyncClient:
    """``Client.request`` as a blocking call."""

    def __init__(self, config: KubeConfig, *, timeout: float = 30.0, connect: float = 5.0) -> None:
        self.config = config
        self.server = config.server
        self._loop: asyncio.AbstractEventLoop | None = None  # made at the first call
        self._client = Client(config, pool=4, timeout=timeout, connect=connect)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        params: Mapping[str, str] | None = None,
    ) -> Response:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(
            self._client.request(method, path, body=body, content_type=content_type, params=params)
        )

    def close(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.run_until_complete(self._client.close())
            self._loop.close()


__all__ = ["SyncClient"]
