"""One trust root for every replica: the self-signed root kept in a Kubernetes Secret.

With a Kubernetes source and no `--ca-cert-dir`, the root lives in Secret
`pilot-ca-secret` in pilot's namespace. A replica that finds it uses it; one
that finds none creates it, but only while holding the `pilot-ca` Lease, and a
create conflict means: read what won. A replica that cannot read the Secret
does not sign: it keeps trying and says why. A Secret whose key is not its
certificate's, whose certificate is not a CA or has expired, stops pilot at
start (`CaSetupError`): the Secret must be fixed or deleted.
"""

from __future__ import annotations

import asyncio
import base64
import logging

from kubernetes_asyncio import client

from pilot.kube.api_client import API_FAILED
from pilot.runtime.backoff import Backoff
from pilot.security.ca import CaSettings, CertificateAuthority
from pilot.security.certs import cert_pem, key_pem, self_signed_root
from pilot.security.lease import CONFLICT, NOT_FOUND, LeaseElector

log = logging.getLogger("pilot.security.ca")

SECRET_NAME = "pilot-ca-secret"
LEASE_NAME = "pilot-ca"
CERT_KEY, KEY_KEY, ROOT_KEY = "ca-cert.pem", "ca-key.pem", "root-cert.pem"
# The API failed, or the Secret holds no such key: not signing, and asking again.
_UNREADABLE: tuple[type[Exception], ...] = (*API_FAILED, ValueError)


def _decode(secret: client.V1Secret, key: str) -> bytes:
    data = secret.data or {}
    if key not in data:
        raise ValueError(f"Secret {SECRET_NAME} has no {key}")
    return base64.b64decode(data[key])


class SharedRoot:
    """Loads (or, as the Lease holder, creates) the root in the Secret."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        settings: CaSettings,
        elector: LeaseElector,
        retry_max: float = 10.0,
    ) -> None:
        self._api = client.CoreV1Api(api_client)
        self.namespace = namespace
        self._settings = settings
        self.elector = elector
        self._retry_max = retry_max

    async def load(self) -> CertificateAuthority:
        """Return the shared CA, waiting (and saying why) until there is one."""
        backoff = Backoff(0.2, self._retry_max)
        while True:
            try:
                ca = await self._attempt()
            except _UNREADABLE as error:
                log.warning(
                    "cannot read the CA root from Secret %s/%s: %s; not signing until it can",
                    self.namespace,
                    SECRET_NAME,
                    getattr(error, "reason", None) or str(error) or type(error).__name__,
                )
                ca = None
            if ca is not None:
                return ca
            await asyncio.sleep(backoff.next_delay())

    async def _attempt(self) -> CertificateAuthority | None:
        secret = await self._read()
        if secret is not None:
            return self._from_secret(secret)
        if not await self.elector.try_acquire():
            log.info("waiting for the Lease holder to create the CA root")
            return None
        secret = await self._read()  # again, now that this replica holds the Lease
        if secret is not None:
            return self._from_secret(secret)
        return await self._create()

    async def _read(self) -> client.V1Secret | None:
        try:
            secret: client.V1Secret = await self._api.read_namespaced_secret(
                SECRET_NAME, self.namespace
            )
        except client.ApiException as error:
            if error.status == NOT_FOUND:
                return None
            raise
        return secret

    def _from_secret(self, secret: client.V1Secret) -> CertificateAuthority:
        ca = CertificateAuthority.from_pem(
            _decode(secret, KEY_KEY), _decode(secret, CERT_KEY), self._settings, self._where
        )
        log.info("CA: using the shared root in Secret %s/%s", self.namespace, SECRET_NAME)
        return ca

    async def _create(self) -> CertificateAuthority | None:
        key, root = await asyncio.to_thread(self_signed_root, self._settings.trust_domain)
        pem_cert, pem_key = cert_pem(root).encode(), key_pem(key)
        data = {CERT_KEY: pem_cert, KEY_KEY: pem_key, ROOT_KEY: pem_cert}
        body = client.V1Secret(
            metadata=client.V1ObjectMeta(name=SECRET_NAME, namespace=self.namespace),
            type="Opaque",
            data={name: base64.b64encode(value).decode() for name, value in data.items()},
        )
        try:
            await self._api.create_namespaced_secret(self.namespace, body)
        except client.ApiException as error:
            if error.status != CONFLICT:
                raise
            log.info("another replica created the CA root first; reading it")
            return None
        log.info("CA: created the shared root in Secret %s/%s", self.namespace, SECRET_NAME)
        return CertificateAuthority.from_pem(pem_key, pem_cert, self._settings, self._where)

    @property
    def _where(self) -> str:
        return f"Secret {self.namespace}/{SECRET_NAME}"
