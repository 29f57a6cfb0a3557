"""Reading a cross-namespace claim's task from the operator, not the API server.

A claim of a task of another namespace (docs/tenancy.md, "Cross-namespace claims")
has its Lease in this worker's namespace, but its AgentTask is in the team's, where
the sidecar has no RBAC (and must get none: it would read every team's payloads).
The operator answers for the claim's holder only:
``GET {operator_url}/v1/claims/{lease namespace}/{lease name}`` with a projected
ServiceAccount token of audience ``agentq.dev/operator`` (read from its file for
every request: the kubelet rotates it), and the answer is shaped like the
AgentTask (``metadata`` name/namespace/uid, ``spec``, ``status.attempt``), so the
watcher activates the attempt from it as from a task it read itself.

Every answer but 200 is a ``ClaimError`` with its HTTP status (0: no answer, or no
token to send); the watcher decides what each means (403 and 404: try again with
backoff; 410: the claim ended).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

Body = dict[str, Any]

# Where manifests/agent/ mounts the projected token (the sidecar container only).
DEFAULT_TOKEN_FILE = "/var/run/secrets/agentq.dev/operator/token"
AUDIENCE = "agentq.dev/operator"
TIMEOUT = aiohttp.ClientTimeout(total=10, sock_connect=3)
MAX_TOKEN_BYTES = 16 * 1024


class ClaimError(Exception):
    """The operator did not hand the claim's task over: ``status`` is its HTTP status,
    or 0 when there was no answer (or no token to send)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class OperatorClaims:
    """Claims' tasks from the operator at ``url``, authenticated by ``token_file``."""

    def __init__(self, url: str, token_file: str = DEFAULT_TOKEN_FILE) -> None:
        self.url = url.rstrip("/")
        self.token_file = token_file
        self._session: aiohttp.ClientSession | None = None

    def _token(self) -> str:
        try:
            raw = Path(self.token_file).read_bytes()[:MAX_TOKEN_BYTES]
        except OSError as err:
            raise ClaimError(0, f"cannot read the operator token {self.token_file}: {err}") from err
        token = raw.decode(errors="replace").strip()
        if not token:
            raise ClaimError(0, f"the operator token file {self.token_file} is empty")
        return token

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=TIMEOUT)
        return self._session

    async def read(self, namespace: str, lease_name: str) -> Body:
        """The task of the claim whose Lease is ``namespace``/``lease_name``."""
        url = f"{self.url}/v1/claims/{quote(namespace, safe='')}/{quote(lease_name, safe='')}"
        headers = {"Authorization": f"Bearer {self._token()}", "Accept": "application/json"}
        try:
            async with self._client().get(url, headers=headers, allow_redirects=False) as rsp:
                status = rsp.status
                raw = await rsp.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            raise ClaimError(0, f"GET {url}: {type(err).__name__}: {err}") from err
        try:
            body = json.loads(raw) if raw else None
        except (ValueError, RecursionError):
            body = None
        if status != 200:
            message = body.get("message") if isinstance(body, dict) else None
            raise ClaimError(status, str(message or raw[:300].decode(errors="replace")))
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("metadata"), dict)
            or not isinstance(body.get("spec"), dict)
        ):
            raise ClaimError(502, f"the operator's answer is not a task: {raw[:200]!r}")
        return body

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


__all__ = ["AUDIENCE", "DEFAULT_TOKEN_FILE", "ClaimError", "OperatorClaims"]
