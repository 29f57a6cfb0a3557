"""Who may call the agent API (``agentq.sidecar.auth``): the secret's file, and the
Host, credential and Content-Type checks, each refusal in the API's error shape."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from agentq.sidecar.attempts import AgentError
from agentq.sidecar.auth import Guard, host_name, is_loopback_listen, new_secret, write_token_file

SECRET = "s3cret-of-this-pod"


def guard(listen: str = "127.0.0.1") -> Guard:
    return Guard(secret=SECRET, listen_host=listen, token_file="/run/agentq/sidecar-token")


def refusal(check: object, *args: object) -> AgentError:
    with pytest.raises(AgentError) as refused:
        check(*args)  # type: ignore[operator]
    body = refused.value.body()
    assert set(body) == {"error", "message"} and body["message"], body
    return refused.value


def test_the_token_file_is_private_and_replaced_whole(tmp_path: Path) -> None:
    path = tmp_path / "shared" / "sidecar-token"
    write_token_file(path, "first")
    assert path.read_text() == "first\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    inode = path.stat().st_ino
    old = os.umask(0)  # a lax umask changes nothing
    try:
        write_token_file(path, "second")
    finally:
        os.umask(old)
    assert path.read_text() == "second\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.stat().st_ino != inode  # a new file renamed over: never half written
    assert [p.name for p in path.parent.iterdir()] == ["sidecar-token"]


def test_a_planted_symlink_is_replaced_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    path = tmp_path / "sidecar-token"
    path.symlink_to(target)
    write_token_file(path, "mine")
    assert not path.is_symlink() and path.read_text() == "mine\n"
    assert target.read_text() == "keep"


def test_secrets_are_random_and_long() -> None:
    secrets = {new_secret() for _ in range(100)}
    assert len(secrets) == 100 and all(len(s) >= 43 for s in secrets)


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("127.0.0.1:8700", "127.0.0.1"),
        ("[::1]:8700", "::1"),
        ("[::1]", "::1"),
        ("LocalHost.", "localhost"),
        ("evil.example:80", "evil.example"),
        ("::1", "::1"),
    ],
)
def test_host_name(header: str, name: str) -> None:
    assert host_name(header) == name


def test_loopback_listen() -> None:
    assert all(is_loopback_listen(h) for h in ("127.0.0.1", "127.1.2.3", "::1", "localhost"))
    assert not any(is_loopback_listen(h) for h in ("0.0.0.0", "::", "10.0.0.5", "pod.example"))


def test_loopback_names_ip_literals_and_the_listen_address_pass_other_names_do_not() -> None:
    g = guard()
    for host in (None, "127.0.0.1:8700", "localhost", "[::1]:1", "10.1.2.3:8700"):
        g.check_host(host)
    for host in ("evil.example", "localhost.evil.example:8700", "127.0.0.1.nip.io", "sidecar"):
        assert refusal(g.check_host, host).status == 403
    named = guard("sidecar.internal")
    named.check_host("sidecar.internal:8700")
    assert refusal(guard("0.0.0.0").check_host, "0.0.0.0.evil.example").code == "HostNotAllowed"


def test_the_credential_must_be_this_starts_secret() -> None:
    g = guard()
    g.check_credential(f"Bearer {SECRET}")
    g.check_credential(f"bearer  {SECRET} ")
    missing = refusal(g.check_credential, None)
    assert (missing.status, missing.code) == (401, "Unauthorized")
    assert "/run/agentq/sidecar-token" in missing.message
    for header in (
        "Bearer",
        "Bearer ",
        f"Basic {SECRET}",
        SECRET,
        f"Bearer {SECRET}x",
        f"Bearer {SECRET[:-1]}",
        "Bearer wrong",
    ):
        refused = refusal(g.check_credential, header)
        assert (refused.status, refused.code) == (401, "Unauthorized"), header


def test_a_body_must_be_json() -> None:
    Guard.check_content_type("GET", False, "")
    Guard.check_content_type("TRACE", False, "")  # routed: 405
    Guard.check_content_type("POST", True, "application/json")
    Guard.check_content_type("POST", True, "Application/JSON; charset=utf-8")
    for method, has_body, content_type in (
        ("POST", True, "application/x-www-form-urlencoded"),
        ("POST", True, "multipart/form-data; boundary=x"),
        ("POST", True, "text/plain"),
        ("POST", True, ""),
        ("POST", False, ""),
        ("GET", True, "text/plain"),
        ("POST", True, "application/jsonp"),
    ):
        refused = refusal(Guard.check_content_type, method, has_body, content_type)
        assert (refused.status, refused.code) == (415, "UnsupportedMediaType")
