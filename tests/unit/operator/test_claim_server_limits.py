"""The claim server's own limits (claim_api.ClaimServer): a connection beyond
``max_connections`` is closed unanswered, oversized headers are refused by the parser,
and the connections under the limit are served as before."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any

from agentq import kube
from agentq.controlplane.cluster import free_port
from agentq.operator.claim_api import MAX_HEADERS, ClaimServer


def run(test: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    @wraps(test)
    def sync() -> None:
        asyncio.run(asyncio.wait_for(test(), 30))

    return sync


async def start(**options: Any) -> tuple[ClaimServer, int]:
    port = free_port()
    config = kube.KubeConfig(server="http://127.0.0.1:9", credentials=kube.Credentials())
    server = await ClaimServer.start(config, None, port=port, host="127.0.0.1", **options)
    return server, port


async def get(port: int, headers: str = "") -> bytes:
    """One request on a new connection: the status line (b'' when closed unanswered)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /v1/claims/a/b HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode())
    await writer.drain()
    line = await reader.readline()
    writer.close()
    return line


@run
async def test_a_connection_beyond_the_limit_is_closed_unanswered() -> None:
    server, port = await start(max_connections=2)
    try:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        await asyncio.sleep(0.1)
        assert await get(port) == b""
        for _, writer in held:
            writer.close()
        await asyncio.sleep(0.1)
        assert (await get(port)).startswith(b"HTTP/1.1 401")
    finally:
        await server.close()


@run
async def test_too_many_or_too_long_headers_are_refused_before_the_handler() -> None:
    server, port = await start()
    try:
        many = "".join(f"X-{i}: y\r\n" for i in range(MAX_HEADERS + 1))
        assert (await get(port, many)).split()[1] in (b"400", b"431")
        long = "X-Long: " + "y" * 20000 + "\r\n"
        assert (await get(port, long)).split()[1] in (b"400", b"431")
        assert (await get(port)).startswith(b"HTTP/1.1 401")
    finally:
        await server.close()
