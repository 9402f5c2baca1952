"""Getting a CSR signed: by pilot's own CA in process, or by the CA at `CA_ADDR`.

The remote client speaks Istio's `IstioCertificateService`: over TLS verified
with `CA_ROOT_CERT`, or plaintext with `CA_INSECURE=true`; it authenticates
with the token in `CA_TOKEN_FILE` (read on every call: projected tokens
rotate) and, when the workload's identity is not pilot's own, asks for it with
`ImpersonatedIdentity` metadata. Every chain must verify against the configured
root (`root_pem`, also what proxies get as `ROOTCA`), whatever the transport: a
root is never learned from what a CA answers. An answer above MAX_ANSWER_BYTES
is refused by gRPC as it arrives, one of more than MAX_CHAIN certificates before
any is parsed, and the checks run in a thread: a CA's answer never holds up
the event loop.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Final, Protocol

import grpc
from cryptography import x509
from google.protobuf import struct_pb2

from pilot._gen.istio.v1.auth import ca_pb2
from pilot.security import leaf_der
from pilot.security.batches import SIGNING_BATCH, ThreadBatches, signing_lane
from pilot.security.ca import CaExpired, CertificateAuthority, CsrError
from pilot.security.ca_service import CA_SERVICE, IMPERSONATED_IDENTITY
from pilot.security.certs import (
    KeyType,
    WorkloadCertificate,
    generate_key,
    key_pem,
    load_certificates,
    public_key_der,
    uri_sans,
    verify_chain,
)
from pilot.security.identity import Identity

CALL_TIMEOUT = 10.0
# A CA's answer: a leaf, its intermediates and the root. Refused beyond these, before
# any of it is parsed (the answer's size at gRPC's door, the count before verifying).
MAX_CHAIN = 10
MAX_ANSWER_BYTES = 256 * 1024
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", MAX_ANSWER_BYTES)]
# Calls per thread hand-off, and threads at once, by key type (see LocalCa).
MINT_BATCH: Final[Mapping[KeyType, int]] = MappingProxyType(
    {KeyType.EC: SIGNING_BATCH, KeyType.RSA: 1}
)
MINT_THREADS: Final[Mapping[KeyType, int]] = MappingProxyType({KeyType.EC: 1, KeyType.RSA: 4})


class CaError(Exception):
    """The CA did not sign (unreachable, refused, or answered something unusable)."""


class CaClient(Protocol):
    """Signs a CSR for an identity; returns the PEM chain, leaf first, root last."""

    async def sign(
        self, csr_pem: bytes, identity: Identity, ttl: datetime.timedelta
    ) -> list[str]: ...


class LocalCa:
    """pilot's own CA, called in process (off the event loop).

    `sign` takes a CSR, as any CA does. `mint` is for the keys of pilot's own
    proxies: key pair and certificate together, with no CSR, since the key is
    made in the same call and no one else ever held it (a CSR would prove
    possession of it to no one). The certificate's key is still checked to be
    the one made, as for any CA's answer.

    Both run in batches (`ThreadBatches`). Signing and EC keys hold the GIL, so
    they share one lane of one thread, `signing`, with the CA service's
    CreateCertificate calls when the component passes the same lane to both.
    RSA keys release the GIL: a lane of up to MINT_THREADS threads, one key each.
    """

    def __init__(
        self,
        ca: CertificateAuthority,
        slots: asyncio.Semaphore,
        signing: ThreadBatches | None = None,
    ) -> None:
        self.ca = ca
        self._lanes = {
            KeyType.EC: signing or signing_lane(slots),
            KeyType.RSA: ThreadBatches(
                slots, MINT_BATCH[KeyType.RSA], MINT_THREADS[KeyType.RSA], "ca-mint-rsa"
            ),
        }

    async def sign(self, csr_pem: bytes, identity: Identity, ttl: datetime.timedelta) -> list[str]:
        try:
            return await self._lanes[KeyType.EC].run(
                functools.partial(self.ca.sign, csr_pem, identity, ttl)
            )
        except (CsrError, CaExpired) as error:
            raise CaError(f"pilot's CA: {error}") from error

    async def mint(
        self, key_type: KeyType, identity: Identity, ttl: datetime.timedelta
    ) -> WorkloadCertificate:
        """A new private key and its certificate naming `identity` (the proven one)."""
        return await self.mint_soon(key_type, identity, ttl)

    def mint_soon(
        self, key_type: KeyType, identity: Identity, ttl: datetime.timedelta
    ) -> asyncio.Future[WorkloadCertificate]:
        """`mint` as a future, for a caller that keeps no task waiting on it; cancel it
        and the key is never made."""
        return self._lanes[key_type].submit(functools.partial(self._mint, key_type, identity, ttl))

    def _mint(
        self, key_type: KeyType, identity: Identity, ttl: datetime.timedelta
    ) -> WorkloadCertificate:
        key = generate_key(key_type)
        spki = public_key_der(key.public_key())
        try:
            leaf = self.ca.issue_workload(spki, identity, ttl)
        except CaExpired as error:
            raise CaError(f"pilot's CA: {error}") from error
        # Read from the leaf's own bytes, not from what it was asked to certify.
        if leaf_der.certified_key(leaf.der) != spki:
            raise CaError("pilot's CA certified a different key than the one it was given")
        chain = "".join(self.ca.chain_pem(leaf)).encode()
        return WorkloadCertificate(chain, key_pem(key), leaf.serial, leaf.not_after)


@dataclass(frozen=True, slots=True)
class RemoteCaSettings:
    """CA_ADDR, CA_ROOT_CERT, CA_INSECURE, CA_TOKEN_FILE, and pilot's own identity."""

    address: str
    root_cert: Path  # the only root its chains may lead to, TLS or not
    insecure: bool = False
    token_file: Path | None = None
    own_identity: Identity | None = None


def _read_token(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text().strip() or None
    except OSError as error:
        raise CaError(f"cannot read CA_TOKEN_FILE {path}: {error.strerror or error}") from error


class RemoteCa:
    """The Istio-protocol CA at CA_ADDR."""

    def __init__(self, settings: RemoteCaSettings) -> None:
        self.settings = settings
        pem = settings.root_cert.read_bytes()
        self.roots: list[x509.Certificate] = load_certificates(pem)
        self.root_pem = pem.decode()
        if settings.insecure:
            self._channel = grpc.aio.insecure_channel(settings.address, options=_CHANNEL_OPTIONS)
        else:
            credentials = grpc.ssl_channel_credentials(root_certificates=pem)
            self._channel = grpc.aio.secure_channel(
                settings.address, credentials, options=_CHANNEL_OPTIONS
            )
        self._call = self._channel.unary_unary(
            f"/{CA_SERVICE}/CreateCertificate",
            request_serializer=ca_pb2.IstioCertificateRequest.SerializeToString,
            response_deserializer=ca_pb2.IstioCertificateResponse.FromString,
        )

    def _request(
        self, csr_pem: bytes, identity: Identity, ttl: datetime.timedelta
    ) -> ca_pb2.IstioCertificateRequest:
        request = ca_pb2.IstioCertificateRequest(
            csr=csr_pem.decode(), validity_duration=int(ttl.total_seconds())
        )
        if identity != self.settings.own_identity:
            request.metadata.CopyFrom(struct_pb2.Struct())
            request.metadata.fields[IMPERSONATED_IDENTITY].string_value = identity.uri
        return request

    async def sign(self, csr_pem: bytes, identity: Identity, ttl: datetime.timedelta) -> list[str]:
        token = _read_token(self.settings.token_file)
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        try:
            response = await self._call(
                self._request(csr_pem, identity, ttl), metadata=metadata, timeout=CALL_TIMEOUT
            )
        except grpc.aio.AioRpcError as error:
            raise CaError(
                f"CA at {self.settings.address}: {error.code().name}: {error.details()}"
            ) from error
        chain = list(response.cert_chain)
        # Parsing and verifying are crypto: off the loop, as every mint is.
        await asyncio.to_thread(self._check, chain, identity)
        return chain

    def _check(self, chain: list[str], identity: Identity) -> None:
        """The answer verifies to the configured root and names `identity` (in a thread)."""
        announced = sum(pem.count("-----BEGIN") for pem in chain)
        if announced > MAX_CHAIN:
            raise CaError(
                f"CA at {self.settings.address} returned a chain of {announced} certificates"
                f" (at most {MAX_CHAIN})"
            )
        try:
            certificates = [c for pem in chain for c in load_certificates(pem.encode())]
            verify_chain(certificates, self.roots)
        except ValueError as error:
            raise CaError(
                f"CA at {self.settings.address} returned a chain that does not verify: {error}"
            ) from error
        signed_for = uri_sans(certificates[0])
        if identity.uri not in signed_for:
            raise CaError(f"CA at {self.settings.address} signed for {signed_for}, not {identity}")

    async def close(self) -> None:
        await self._channel.close(None)
