"""TLS on the claim port (``agentq.operator.claim_tls``, the sidecar's
``OperatorClaims`` with a CA bundle): real handshakes on loopback, certificates from
``tests/certs.py``.

- the served pair is re-read when its files change; a pair that does not load leaves
  the last good one served; none yet: handshakes refused, the server runs on;
- the sidecar trusts its CA bundle alone and checks the name: another CA, an expired
  certificate, another name, no bundle -> a ``ClaimError`` marked ``tls``;
- the expiry read from the certificate is cryptography's;
- the TLS gauges have no sample on a plain HTTP claim port (its alerts never see it),
  ready 0 and no expiry while certificate files are given but none loaded.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from aiohttp import web
from cryptography import x509
from prometheus_client import REGISTRY, generate_latest

from agentq import kube
from agentq.controlplane.cluster import free_port
from agentq.operator.claim_api import ClaimServer
from agentq.operator.claim_tls import ServingCert, not_after
from agentq.operator.config import OperatorConfig
from agentq.sidecar.operator_claims import ClaimError, OperatorClaims
from certs import SERVICE_NAME, Ca
from harness import run

pytestmark = pytest.mark.unit

TASK = {"metadata": {"name": "job", "namespace": "team", "uid": "u"}, "spec": {}, "status": {}}


def gauge(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def declared(name: str) -> bool:
    return f"# TYPE {name} gauge" in generate_latest(REGISTRY).decode()


@asynccontextmanager
async def serving(tls: ServingCert) -> AsyncIterator[str]:
    async def claim(_: web.Request) -> web.Response:
        return web.json_response(TASK)

    app = web.Application()
    app.router.add_get("/v1/claims/{namespace}/{name}", claim)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=tls.context).start()
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def ask(url: str, ca: Path, token: Path, server_name: str | None = None) -> object:
    claims = OperatorClaims(url, str(token), ca_file=str(ca), server_name=server_name)
    try:
        return await claims.read("pool", "agentq-xtask-team.job")
    except ClaimError as err:
        return err
    finally:
        await claims.close()


def touch_later(path: Path, data: bytes) -> None:
    """Rewrite ``path`` so that its stamp surely changes (a new inode, as the kubelet's
    swap of a Secret's ``..data`` gives)."""
    fresh = path.with_suffix(".new")
    fresh.write_bytes(data)
    os.replace(fresh, path)


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("a-token")
    return path


def test_not_after_is_the_certificates_expiry() -> None:
    ca = Ca.make()
    for when in (
        datetime.datetime(2031, 5, 6, 7, 8, 9, tzinfo=datetime.UTC),  # UTCTime
        datetime.datetime(2051, 1, 2, 3, 4, 5, tzinfo=datetime.UTC),  # GeneralizedTime
    ):
        pem, _ = ca.serving(not_after=when)
        assert not_after(pem) == when.timestamp()
        assert x509.load_pem_x509_certificate(pem).not_valid_after_utc == when
    assert not_after(b"not a certificate") is None
    assert not_after(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----") is None


@run
async def test_the_served_pair_follows_its_files_and_a_bad_one_changes_nothing(
    tmp_path: Path, token: Path
) -> None:
    ca = Ca.make()
    ca_file = ca.write(tmp_path / "ca.crt")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    tls = ServingCert(str(cert), str(key))
    # No files yet: nothing to serve; the port refuses handshakes, the server runs on.
    assert not tls.reload()
    assert not tls.ready and gauge("agentq_claim_tls_ready") == 0
    assert "FileNotFoundError" in tls.error
    async with serving(tls) as url:
        refused = await ask(url, ca_file, token)
        assert isinstance(refused, ClaimError) and refused.tls and refused.code == "tls"

        first = ca.serving()
        cert.write_bytes(first[0])
        key.write_bytes(first[1])
        assert tls.reload() and tls.ready
        assert gauge("agentq_claim_tls_ready") == 1
        assert gauge("agentq_claim_tls_not_after_seconds") == not_after(first[0])
        assert await ask(url, ca_file, token) == TASK
        assert not tls.reload(), "unchanged files are not loaded again"

        # A key that is not the certificate's (a half-done rotation): the old pair stays.
        errors = REGISTRY.get_sample_value("agentq_claim_tls_reloads_total", {"result": "error"})
        touch_later(key, ca.serving()[1])
        assert not tls.reload()
        assert tls.error and tls.ready
        assert (
            REGISTRY.get_sample_value("agentq_claim_tls_reloads_total", {"result": "error"})
            == (errors or 0) + 1
        )
        assert await ask(url, ca_file, token) == TASK

        # A renewed pair, from another CA: served at the next look; the old CA refuses it.
        other = Ca.make("another-ca")
        renewed = other.serving(
            not_after=datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=60)
        )
        touch_later(cert, renewed[0])
        touch_later(key, renewed[1])
        assert tls.reload()
        assert tls.expires == not_after(renewed[0])
        wrong_ca = await ask(url, ca_file, token)
        assert isinstance(wrong_ca, ClaimError) and wrong_ca.tls, wrong_ca
        assert "CERTIFICATE_VERIFY_FAILED" in wrong_ca.message
        # The sidecar's bundle rotated too (its ConfigMap updated): trusted again.
        touch_later(ca_file, other.pem)
        assert await ask(url, ca_file, token) == TASK


@run
async def test_the_sidecar_refuses_an_expired_or_misnamed_certificate(
    tmp_path: Path, token: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca = Ca.make()
    ca_file = ca.write(tmp_path / "ca.crt")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    now = datetime.datetime.now(datetime.UTC)
    ca.write_serving(
        cert,
        key,
        not_before=now - datetime.timedelta(days=2),
        not_after=now - datetime.timedelta(days=1),
    )
    tls = ServingCert(str(cert), str(key))
    tls.reload()
    assert tls.ready and tls.expires is not None and tls.expires < now.timestamp()
    assert "expired" in caplog.text
    async with serving(tls) as url:
        expired = await ask(url, ca_file, token)
        assert isinstance(expired, ClaimError) and expired.tls
        assert "expired" in expired.message

        # Valid, but for another name than the one the sidecar asks for.
        touch_later(cert, (pair := ca.serving(("somewhere-else.example",)))[0])
        touch_later(key, pair[1])
        assert tls.reload()
        misnamed = await ask(url, ca_file, token)
        assert isinstance(misnamed, ClaimError) and misnamed.tls
        assert "127.0.0.1" in misnamed.message or "match" in misnamed.message

        # The Service's name, reached by address: --operator-server-name checks that name.
        touch_later(cert, (pair := ca.serving((SERVICE_NAME,)))[0])
        touch_later(key, pair[1])
        assert tls.reload()
        assert await ask(url, ca_file, token, server_name=SERVICE_NAME) == TASK
        assert isinstance(await ask(url, ca_file, token), ClaimError)


@run
async def test_a_missing_or_unreadable_ca_bundle_is_a_tls_error(
    tmp_path: Path, token: Path
) -> None:
    missing = await ask("https://127.0.0.1:1", tmp_path / "nothing.crt", token)
    assert isinstance(missing, ClaimError) and missing.tls and "nothing.crt" in missing.message
    junk = tmp_path / "junk.crt"
    junk.write_text("not PEM")
    bad = await ask("https://127.0.0.1:1", junk, token)
    assert isinstance(bad, ClaimError) and bad.tls and "does not load" in bad.message
    with pytest.raises(ValueError, match="CA file"):
        OperatorClaims("https://operator:8444", str(token))


def test_a_certificate_without_its_key_is_said_not_fatal(tmp_path: Path) -> None:
    cert = tmp_path / "tls.crt"
    cert.write_bytes(Ca.make().serving()[0])
    OperatorConfig(claim_cert_file=str(cert)).check()  # the operator starts
    tls = ServingCert(str(cert), "")
    assert not tls.reload() and not tls.ready and "go together" in tls.error


def test_a_sidecar_given_an_https_operator_without_its_ca_does_not_start() -> None:
    from click.testing import CliRunner

    from agentq.sidecar.command import sidecar

    result = CliRunner().invoke(
        sidecar,
        ["--worker", "w1", "--operator-url", f"https://{SERVICE_NAME}:8444"],
        env={"AGENTQ_OPERATOR_CA_FILE": ""},
    )
    assert result.exit_code == 2, result.output
    assert "give --operator-ca-file" in result.output


def test_an_encrypted_key_is_refused_without_asking_for_a_pass_phrase(tmp_path: Path) -> None:
    """OpenSSL asks the controlling terminal for the pass phrase of an encrypted key when
    given no password: the operator (run by hand, or in a pod with a tty) waited there,
    its event loop with it. The key is refused instead, as any pair that does not load."""
    import subprocess
    import sys
    import textwrap

    from cryptography.hazmat.primitives import serialization

    cert, key = Ca.make().serving()
    encrypted = serialization.load_pem_private_key(key, None).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(encrypted)
    # A child with a terminal of its own (pty.fork), as an operator run by hand has.
    script = textwrap.dedent(
        f"""
        import os, pty, select, sys, time
        pid, fd = pty.fork()
        if pid == 0:
            from agentq.operator.claim_tls import ServingCert
            tls = ServingCert({str(tmp_path / "tls.crt")!r}, {str(tmp_path / "tls.key")!r})
            tls.reload()
            print("LOADED" if tls.ready else "REFUSED", flush=True)
            os._exit(0)
        out, end = b"", time.time() + 10
        while time.time() < end and b"LOADED" not in out and b"REFUSED" not in out:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    out += os.read(fd, 4096)
                except OSError:
                    break
        os.kill(pid, 9)
        print(out.decode(errors="replace"))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=30)
    said = done.stdout.decode()
    assert "pass phrase" not in said.lower(), said
    assert "REFUSED" in said, said


@run
async def test_the_tls_gauges_say_nothing_on_a_plain_port_and_0_while_none_loads(
    tmp_path: Path,
) -> None:
    ready, expiry = "agentq_claim_tls_ready", "agentq_claim_tls_not_after_seconds"
    # Given files, none loadable yet: ready 0 (AgentqClaimTLSNotServing), no expiry.
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    tls = ServingCert(str(cert), str(key))
    assert not tls.reload()
    assert REGISTRY.get_sample_value(ready) == 0
    assert REGISTRY.get_sample_value(expiry) is None
    pair = Ca.make().serving()
    cert.write_bytes(pair[0])
    key.write_bytes(pair[1])
    assert tls.reload()
    assert REGISTRY.get_sample_value(ready) == 1
    assert REGISTRY.get_sample_value(expiry) == not_after(pair[0])

    # A plain HTTP claim port (no certificate flags): no sample of either, so no TLS
    # alert fires for it; both stay declared for the dashboard and the rules.
    config = kube.KubeConfig(server="https://127.0.0.1:6443", credentials=kube.Credentials())
    server = await ClaimServer.start(config, None, port=free_port(), host="127.0.0.1")
    try:
        assert server.tls is None
        assert REGISTRY.get_sample_value(ready) is None
        assert REGISTRY.get_sample_value(expiry) is None
        assert declared(ready) and declared(expiry)
    finally:
        await server.close()
