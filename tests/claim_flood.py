"""A flood of the claim API, as a hostile (or broken) agent pod could send it:
``python tests/claim_flood.py URL SECONDS CONCURRENCY``. Every request is a new
connection (a TLS handshake on an https:// URL, certificate not verified) with a new
random bearer token: each one the operator has never reviewed. Prints one JSON line:
answers by HTTP status (0: no answer), and requests per second."""

from __future__ import annotations

import asyncio
import json
import secrets
import ssl
import sys
import time
from collections import Counter

import aiohttp


async def flood(url: str, seconds: float, concurrency: int) -> dict[str, object]:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    codes: Counter[int] = Counter()
    end = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=15)

    async def one(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < end:
            token = "eyJhbGciOiJSUzI1NiJ9." + secrets.token_urlsafe(300) + ".x"
            try:
                async with session.get(
                    url, headers={"Authorization": f"Bearer {token}", "Connection": "close"}
                ) as rsp:
                    await rsp.read()
                    codes[rsp.status] += 1
                    if rsp.status in (429, 503):
                        await asyncio.sleep(0.05)
            except (TimeoutError, aiohttp.ClientError, OSError):
                codes[0] += 1
                await asyncio.sleep(0.05)

    connector = aiohttp.TCPConnector(ssl=context, force_close=True, limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.monotonic()
        await asyncio.gather(*(one(session) for _ in range(concurrency)))
        took = time.monotonic() - started
    total = sum(codes.values())
    return {"codes": {str(k): v for k, v in sorted(codes.items())}, "rps": round(total / took, 1)}


if __name__ == "__main__":
    url, seconds, concurrency = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    print(json.dumps(asyncio.run(flood(url, seconds, concurrency))), flush=True)
