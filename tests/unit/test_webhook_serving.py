"""The webhook's serving certificate: issued by pilot's CA for the Service's names, and
renewed in place: a handshake after the renewal gets the new certificate; a CA that can
no longer sign leaves the current one serving, and is asked again later.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from pilot.security.ca import CaExpired, CaSettings, CertificateAuthority
from pilot.security.certs import utcnow
from pilot.webhook import serving
from pilot.webhook.serving import WebhookCertificate

NAMES = ["pilot", "pilot.pilot-system", "pilot.pilot-system.svc"]


async def _serial(port: int, root_pem: str) -> int:
    """The serial number of the certificate a new TLS handshake gets, verified."""
    context = ssl.create_default_context(cadata=root_pem)
    _, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=context, server_hostname="pilot.pilot-system.svc"
    )
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return x509.load_der_x509_certificate(der).serial_number


async def _one_renewal(certificate: WebhookCertificate, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the renewal loop until it has renewed once (its sleeps made instant)."""
    real_sleep = asyncio.sleep
    sleeps: list[float] = []

    async def quick_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(serving.asyncio, "sleep", quick_sleep)
    certificate._expires = utcnow()  # due now
    renewal = asyncio.create_task(certificate.run())
    while len(sleeps) < 2:  # the first sleep, the renewal, the next sleep
        await real_sleep(0.01)
    renewal.cancel()


async def test_a_renewed_certificate_is_what_new_handshakes_get(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = CertificateAuthority.load(CaSettings(state_dir=tmp_path / "ca"))
    certificate = WebhookCertificate(ca, NAMES)
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0, ssl=certificate.context)
    port = server.sockets[0].getsockname()[1]
    try:
        first = await _serial(port, ca.root_pem)
        assert await _serial(port, ca.root_pem) == first
        await _one_renewal(certificate, monkeypatch)
        assert await _serial(port, ca.root_pem) != first
    finally:
        server.close()


async def test_renewal_keeps_trying_when_the_ca_expired(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ca = CertificateAuthority.load(CaSettings(state_dir=tmp_path / "ca"))
    certificate = WebhookCertificate(ca, NAMES)

    def expired(*args: Any) -> Any:
        raise CaExpired("the CA expired")

    monkeypatch.setattr(ca, "issue_server", expired)
    caplog.set_level(logging.ERROR, "pilot.webhook")
    await _one_renewal(certificate, monkeypatch)
    assert any("cannot renew the webhook" in r.getMessage() for r in caplog.records)
