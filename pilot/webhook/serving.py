"""The webhook's serving certificate: issued by pilot's own CA for its Service's names,
renewed at half-life, as the TLS xDS port's (`pilot.security.serving`).

The API server verifies it with the caBundle pilot writes (its CA's root). The key lives
in memory only: Python's `ssl` loads keys from files, so it is handed over through an
anonymous memory file (memfd_create), or where there is none a private directory
(0700, the file 0600) removed at once. A renewed certificate is loaded into the same
`SSLContext`: new handshakes get it, open connections keep theirs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import ssl
import tempfile
from collections.abc import Iterator

from pilot.security.ca import CaExpired, CertificateAuthority
from pilot.security.certs import load_certificates, utcnow
from pilot.security.serving import RETRY_SECONDS, SERVING_TTL

log = logging.getLogger("pilot.webhook")


@contextlib.contextmanager
def _private_file(data: bytes) -> Iterator[str]:
    """A path only this process can read, holding `data`, gone on exit."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("pilot-webhook-tls", os.MFD_CLOEXEC)
        try:
            os.write(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    private = tempfile.mkdtemp(prefix="pilot-webhook-")  # 0700
    try:
        fd, path = tempfile.mkstemp(dir=private)  # 0600
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        yield path
    finally:
        shutil.rmtree(private, ignore_errors=True)


class WebhookCertificate:
    """The webhook's `SSLContext`, and the loop renewing its certificate."""

    def __init__(self, ca: CertificateAuthority, dns_names: list[str]) -> None:
        self._ca = ca
        self.dns_names = dns_names
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.context.set_alpn_protocols(["http/1.1"])  # the API server speaks HTTP/1.1 here
        self._expires = utcnow()
        self._load(*self._issue())

    def _issue(self) -> tuple[bytes, list[str]]:
        return self._ca.issue_server(self.dns_names, SERVING_TTL)

    def _load(self, key: bytes, chain: list[str]) -> None:
        pem = "".join(chain).encode()
        with _private_file(pem) as cert_path, _private_file(key) as key_path:
            self.context.load_cert_chain(cert_path, key_path)
        self._expires = load_certificates(chain[0].encode())[0].not_valid_after_utc

    async def run(self) -> None:
        """Renew at half of the remaining lifetime, forever; a CA that can no longer sign
        leaves the current certificate serving, and is asked again later."""
        while True:
            await asyncio.sleep(max((self._expires - utcnow()).total_seconds() / 2, 1.0))
            try:
                key, chain = await asyncio.to_thread(self._issue)
            except CaExpired as error:
                log.error("cannot renew the webhook's serving certificate: %s; trying again", error)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            self._load(key, chain)
            log.info("renewed the webhook's serving certificate for %s", ", ".join(self.dns_names))
