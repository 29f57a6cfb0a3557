"""The claim port's serving certificate, re-read when its files change.

The operator serves the claim API over TLS when it is given a certificate and key
(``--claim-cert-file``, ``--claim-key-file``: PEM files, as a ``kubernetes.io/tls``
Secret mounts them). The kubelet updates a mounted Secret in place (an atomic swap of
its ``..data`` link), and cert-manager renews a Certificate's Secret weeks before it
expires, so the files are looked at every ``RELOAD_SECONDS`` and a changed pair is
loaded for the next handshakes; connections already open keep theirs.

One listening ``SSLContext`` never changes: its SNI callback hands every handshake to
the current context (a fresh one per loaded pair). So a pair that does not load (a
key that is not the certificate's, a half-written file, none yet) changes nothing:
the last good pair is served, the error is logged and counted, and the files are
tried again when they change. Before any pair has loaded, handshakes are refused
with an ``internal_error`` alert: the operator runs on (it never crash-loops for a
certificate), its claim port answers no one, and ``agentq_claim_tls_ready`` says 0.

``agentq_claim_tls_not_after_seconds`` is the served certificate's expiry (a Unix
time) for an alert (AgentqClaimCertExpiring); both gauges have no sample in a process
that serves plain HTTP, so the alerts see only operators given certificate files. An
expired one is logged as an error at every look (a sidecar refuses it: ``certificate
has expired``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import calendar
import logging
import os
import re
import ssl
import time

from agentq.operator import metrics

log = logging.getLogger("agentq.operator.claims")

RELOAD_SECONDS = 10.0
_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", re.S)

Stamp = tuple[tuple[int, int, int], ...] | None


def not_after(pem: bytes) -> float | None:
    """The expiry (Unix time) of the first certificate of ``pem``, or None when it is
    not a certificate this reads (X.509 DER: tbsCertificate's validity.notAfter)."""
    found = _PEM_CERT.search(pem)
    if found is None:
        return None
    try:
        der = base64.b64decode(b"".join(found.group(1).split()), validate=True)
        _, start, _ = _tlv(der, 0)  # Certificate
        _, at, end = _tlv(der, start)  # tbsCertificate
        tag, _, skip = _tlv(der, at)
        if tag == 0xA0:  # [0] version
            at = skip
        for _ in range(3):  # serialNumber, signature, issuer
            _, _, at = _tlv(der, at)
        tag, at, _ = _tlv(der, at)  # validity
        if tag != 0x30:
            return None
        _, _, at = _tlv(der, at)  # notBefore
        tag, start, end = _tlv(der, at)  # notAfter
        text = der[start:end].decode("ascii")
    except (binascii.Error, IndexError, ValueError):
        return None
    if tag == 0x17 and len(text) == 13:  # UTCTime YYMMDDHHMMSSZ
        year = int(text[:2])
        text = f"{1900 + year if year >= 50 else 2000 + year}{text[2:]}"
    elif tag != 0x18 or len(text) != 15:  # GeneralizedTime YYYYMMDDHHMMSSZ
        return None
    try:
        return float(calendar.timegm(time.strptime(text, "%Y%m%d%H%M%SZ")))
    except ValueError:
        return None


def _tlv(der: bytes, at: int) -> tuple[int, int, int]:
    """``(tag, content start, content end)`` of the DER element at ``at``."""
    tag, length = der[at], der[at + 1]
    at += 2
    if length & 0x80:
        size = length & 0x7F
        if not 1 <= size <= 4:
            raise ValueError("DER length")
        length = int.from_bytes(der[at : at + size], "big")
        at += size
    if at + length > len(der):
        raise ValueError("DER truncated")
    return tag, at, at + length


def _no_pass_phrase() -> bytes:
    raise ValueError("the key is encrypted: give the claim port an unencrypted key")


class ServingCert:
    """The claim port's TLS: ``context`` is what the server listens with (see the
    module docstring); ``reload()`` loads the files when they changed."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.sni_callback = self._pick
        self.current: ssl.SSLContext | None = None
        self.expires: float | None = None
        self.error = ""
        self._stamp: Stamp = None
        self._tried = False
        metrics.CLAIM_TLS_READY.set(0)
        metrics.CLAIM_TLS_NOT_AFTER.clear()

    @property
    def ready(self) -> bool:
        return self.current is not None

    def _pick(
        self, sslobj: ssl.SSLObject, server_name: str | None, _: ssl.SSLContext
    ) -> int | None:
        current = self.current
        if current is None:
            return ssl.ALERT_DESCRIPTION_INTERNAL_ERROR
        sslobj.context = current
        return None

    def _files_stamp(self) -> Stamp:
        stamps = []
        for path in (self.cert_file, self.key_file):
            if not path:
                return None
            try:
                st = os.stat(path)  # through the kubelet's ..data link
            except OSError:
                return None
            stamps.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(stamps)

    def reload(self, now: float | None = None) -> bool:
        """Load the pair if its files changed since the last try; True if a new pair
        is served now."""
        stamp = self._files_stamp()
        changed = not self._tried or stamp != self._stamp
        loaded = False
        if changed:
            self._tried = True
            self._stamp = stamp
            loaded = self._load()
        self._check_expiry(time.time() if now is None else now)
        return loaded

    def _load(self) -> bool:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            if not self.cert_file or not self.key_file:
                raise ValueError(
                    "--claim-cert-file and --claim-key-file go together (a certificate and its key)"
                )
            # Never OpenSSL's prompt on the terminal for an encrypted key's pass phrase
            # (it would hold the event loop): such a key does not load.
            context.load_cert_chain(self.cert_file, self.key_file, password=_no_pass_phrase)
            with open(self.cert_file, "rb") as f:
                pem = f.read()
        except (OSError, ssl.SSLError, ValueError) as err:
            self.error = f"{type(err).__name__}: {err}"
            metrics.CLAIM_TLS_RELOADS.labels(result="error").inc()
            if self.current is None:
                log.error(
                    "claim API: no TLS certificate to serve yet (%s, %s): %s; handshakes are "
                    "refused until the files hold a certificate and its key",
                    self.cert_file,
                    self.key_file,
                    self.error,
                )
            else:
                log.error(
                    "claim API: the changed TLS certificate (%s, %s) does not load: %s; still "
                    "serving the previous one",
                    self.cert_file,
                    self.key_file,
                    self.error,
                )
            return False
        first = self.current is None
        self.current = context
        self.error = ""
        self.expires = not_after(pem)
        metrics.CLAIM_TLS_RELOADS.labels(result="ok").inc()
        metrics.CLAIM_TLS_READY.set(1)
        metrics.CLAIM_TLS_NOT_AFTER.set(self.expires or 0)
        log.info(
            "claim API: %s TLS certificate %s (expires %s)",
            "serving" if first else "now serving the renewed",
            self.cert_file,
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.expires))
            if self.expires
            else "at an unknown time",
        )
        return True

    def _check_expiry(self, now: float) -> None:
        if self.current is not None and self.expires is not None and self.expires <= now:
            log.error(
                "claim API: the served TLS certificate %s expired at %s: sidecars refuse it; "
                "renew it (its Secret) and the operator serves the new one within %ss",
                self.cert_file,
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.expires)),
                int(RELOAD_SECONDS),
            )

    async def watch(self, interval: float = RELOAD_SECONDS) -> None:
        """Look at the files every ``interval`` seconds, until cancelled."""
        while True:
            await asyncio.sleep(interval)
            try:
                self.reload()
            except Exception:  # never the end of the watch: the last pair stays served
                log.exception("claim API: looking at the TLS certificate failed")


__all__ = ["RELOAD_SECONDS", "ServingCert", "not_after"]
