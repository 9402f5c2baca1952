"""Raw TLS probes of an mTLS listener, as a client that is not an Envoy.

Owns `tls_get` (connect trusting a root, optionally present a client
certificate, GET /probe, report the status line or why there was none, and the
peer's identity), `served_certificate` (the certificate a TLS port serves,
verified against a root) and `probe_credentials` (a client certificate signed by
a CA).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from pilot.security.ca import CertificateAuthority
from pilot.security.certs import KeyType, new_key_and_csr
from pilot.security.identity import Identity
from tests.support.sds_secrets import uri_sans


@dataclass(frozen=True)
class TlsOutcome:
    """What a raw TLS client saw: an HTTP status line, or why it got none."""

    status_line: str | None
    error: str | None
    peer_uris: tuple[str, ...] = ()
    peer_serial: int | None = None


async def tls_get(
    port: int,
    root_pem: str,
    workdir: Path,
    client_pem: tuple[bytes, bytes] | None = None,
    timeout: float = 5.0,  # noqa: ASYNC109 - a bound on one probe
) -> TlsOutcome:
    """Connect to 127.0.0.1:port with TLS trusting `root_pem`, GET /probe, read the status.

    `client_pem` is (chain PEM, key PEM) to present, written 0600 to `workdir` for
    `ssl`; without it no client certificate is offered. Names are not checked (SPIFFE
    certificates carry only a URI SAN); the chain is.
    """
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=root_pem)
    context.check_hostname = False
    if client_pem is not None:
        chain_path, key_path = workdir / "probe-chain.pem", workdir / "probe-key.pem"
        chain_path.write_bytes(client_pem[0])
        key_path.touch(mode=0o600)
        key_path.write_bytes(client_pem[1])
        context.load_cert_chain(chain_path, key_path)
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
            peer = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
            certificate = x509.load_der_x509_certificate(peer)
            writer.write(b"GET /probe HTTP/1.1\r\nHost: shop\r\nConnection: close\r\n\r\n")
            await writer.drain()
            line = await reader.readline()
    except (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError) as error:
        return TlsOutcome(None, f"{type(error).__name__}: {error}")
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(ssl.SSLError, ConnectionError):
                await writer.wait_closed()
    if not line:
        return TlsOutcome(None, "connection closed without an answer")
    return TlsOutcome(
        line.decode(errors="replace").strip(),
        None,
        uri_sans(certificate),
        certificate.serial_number,
    )


async def served_certificate(port: int, root_pem: str) -> x509.Certificate:
    """The certificate 127.0.0.1:port serves, its chain verified against `root_pem`.

    Names are not checked here (SPIFFE certificates carry only a URI SAN; a test
    reads the names itself).
    """
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=root_pem)
    context.check_hostname = False
    async with asyncio.timeout(5):
        _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
        with contextlib.suppress(ssl.SSLError, ConnectionError):
            await writer.wait_closed()
    return x509.load_der_x509_certificate(der)


def probe_credentials(ca: CertificateAuthority, identity: Identity) -> tuple[bytes, bytes]:
    """(chain PEM, key PEM) for a test client, signed by `ca` for `identity` (one hour)."""
    key_pem, csr = new_key_and_csr(KeyType.EC, [identity.uri])
    chain = ca.sign(csr, identity, datetime.timedelta(hours=1))
    return "".join(chain).encode(), key_pem
