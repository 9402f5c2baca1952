"""The TLS xDS port's serving certificate: issued by pilot's own CA, renewed at half-life.

Envoys verify pilot with the `ROOTCA` they already trust and present their
token (or a client certificate). grpc's dynamic server credentials take the
renewed certificate on new handshakes without restarting the port.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import threading

import grpc

from pilot.security.ca import CaExpired, CertificateAuthority
from pilot.security.certs import load_certificates, utcnow

log = logging.getLogger("pilot.security")

SERVING_TTL = datetime.timedelta(days=1)
RETRY_SECONDS = 60.0


def default_dns_names(cluster_domain: str, service: str = "pilot") -> list[str]:
    """The names an in-cluster Envoy may dial pilot by (namespace from POD_NAMESPACE)."""
    namespace = os.environ.get("POD_NAMESPACE", "default")
    return [
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.{cluster_domain}",
        "localhost",
    ]


class TlsServing:
    """The current serving certificate, and the renewal loop."""

    def __init__(
        self, ca: CertificateAuthority, dns_names: list[str], require_client_cert: bool = False
    ) -> None:
        self._ca = ca
        self._dns_names = dns_names
        self._lock = threading.Lock()  # the fetcher runs on grpc's threads
        self._renewed: grpc.ServerCertificateConfiguration | None = None
        self._expires = utcnow()
        initial = self._issue()
        self.credentials = grpc.dynamic_ssl_server_credentials(
            initial,
            self._fetch,  # type: ignore[arg-type]  # None means "keep the current one"
            # Python's grpc can require client certificates or not ask for them at all;
            # it cannot ask without requiring. Without requiring, callers use tokens.
            require_client_authentication=require_client_cert,
        )

    def _issue(self) -> grpc.ServerCertificateConfiguration:
        key, chain = self._ca.issue_server(self._dns_names, SERVING_TTL)
        self._expires = load_certificates(chain[0].encode())[0].not_valid_after_utc
        return grpc.ssl_server_certificate_configuration(
            [(key, "".join(chain).encode())], root_certificates=self._ca.root_pem.encode()
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        with self._lock:
            renewed, self._renewed = self._renewed, None
            return renewed

    async def run(self) -> None:
        """Renew at half of the remaining lifetime, forever.

        A CA that can no longer sign (it expired) does not end the loop: the
        current certificate keeps serving, and renewal is tried again later.
        """
        while True:
            await asyncio.sleep(max((self._expires - utcnow()).total_seconds() / 2, 1.0))
            try:
                configuration = await asyncio.to_thread(self._issue)
            except CaExpired as error:
                log.error("cannot renew the TLS serving certificate: %s; trying again", error)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            with self._lock:
                self._renewed = configuration
            log.info("renewed the TLS serving certificate for %s", ", ".join(self._dns_names))
