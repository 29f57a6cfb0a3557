"""Who may call the agent API: the per-pod secret, and the Host and Content-Type checks.

At start the sidecar makes a random secret and writes it (mode 0600, atomically) to
its token file, in a volume it shares with the agent container alone; every call
must carry it as ``Authorization: Bearer <secret>``. Another container of the pod
(the loopback interface is the pod's) or a process on the node cannot read the
file, so it cannot call. Two browser attacks are stopped before the secret is even
looked at: DNS rebinding (a page whose name resolves to 127.0.0.1 sends its own
name as Host: only loopback names, IP literals and the listen address are taken)
and form posts (a body must be ``application/json``, which a form cannot send
without a CORS preflight the sidecar never answers).
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import os
import secrets
from pathlib import Path

# In a pod: an emptyDir mounted there in the sidecar and read-only in the agent
# container (manifests/agent/agent.yaml). Both sides read the same variable: the agent
# SDK's names.
from agentq.agent import TOKEN_FILE_ENV
from agentq.sidecar.attempts import AgentError

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
WILDCARDS = frozenset({"", "0.0.0.0", "::"})


def new_secret() -> str:
    """256 random bits, URL-safe (43 characters)."""
    return secrets.token_urlsafe(32)


def write_token_file(path: Path, secret: str) -> None:
    """Write ``secret`` to ``path`` (0600), replacing any earlier one at once: a reader
    sees the old secret or the new one, never a part. The directory is made (0700) if
    missing."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, (secret + "\n").encode())
        os.fchmod(fd, 0o600)  # whatever the umask
    finally:
        os.close(fd)
    os.replace(tmp, path)


def is_loopback_listen(host: str) -> bool:
    """Whether a listen host is reachable from this network namespace only."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name part of a Host header: lowercase, without port, brackets or final dot."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value[1:]
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


class Guard:
    """The checks every call to the agent API passes, in order: Host, credential,
    Content-Type. Each failure is an AgentError in the API's error shape."""

    def __init__(self, *, secret: str, listen_host: str, token_file: str) -> None:
        self._secret = secret.encode()
        self.token_file = token_file
        listen = listen_host.strip("[]").lower()
        self._names = set(LOOPBACK_NAMES)
        if listen not in WILDCARDS:
            self._names.add(listen)

    def check_host(self, header: str | None) -> None:
        """Refuse a Host that is not a loopback name, an IP literal (a DNS-rebinding
        page always sends its own name) or the listen address. No Host at all (HTTP/1.0
        clients) is let through: every browser sends one."""
        if header is None:
            return
        name = host_name(header)
        if name in self._names:
            return
        try:
            ipaddress.ip_address(name)
        except ValueError:
            pass
        else:
            return  # an IP literal: not a name an attacker's page can resolve to us
        raise AgentError(
            403,
            "HostNotAllowed",
            f"Host {header[:100]!r} is not this sidecar: call it by a loopback address "
            "(127.0.0.1, [::1], localhost) or its listen address",
        )

    def check_credential(self, header: str | None) -> None:
        """Refuse a call without ``Authorization: Bearer <secret>`` or with another one
        (401); the comparison takes the same time whatever the guess."""
        if not header:
            raise AgentError(
                401,
                "Unauthorized",
                "this call needs the sidecar's secret: send 'Authorization: Bearer <secret>' "
                f"with the contents of the sidecar's token file ({self.token_file}; "
                f"${TOKEN_FILE_ENV})",
            )
        scheme, _, value = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise AgentError(
                401,
                "Unauthorized",
                "the Authorization header must be 'Bearer <secret>' (the contents of the "
                f"sidecar's token file, {self.token_file})",
            )
        if not hmac.compare_digest(value.strip().encode(), self._secret):
            raise AgentError(
                401,
                "Unauthorized",
                "the secret is wrong: the sidecar makes a new one each time it starts; "
                f"read its token file ({self.token_file}) again",
            )

    @staticmethod
    def check_content_type(method: str, has_body: bool, content_type: str) -> None:
        """A request with a body, and every POST, PUT or PATCH, must say
        ``application/json`` (415); a bodiless request of another method goes on to be
        routed (an unknown method gets its 405)."""
        media = content_type.split(";", 1)[0].strip().lower()
        if media == "application/json" or (not has_body and method not in ("POST", "PUT", "PATCH")):
            return
        raise AgentError(
            415,
            "UnsupportedMediaType",
            f"the body must be JSON sent as 'Content-Type: application/json', "
            f"not {content_type[:100]!r}",
        )
