"""`istio.v1.auth.IstioCertificateService` on pilot's gRPC port, backed by pilot's CA.

The certificate's identity is the authenticated caller's, whatever the CSR
asks for, unless the caller is a trusted node account (CA_TRUSTED_NODE_ACCOUNTS,
`ns/sa,...`) asking for another identity through `ImpersonatedIdentity`.
Refusals carry a status and a reason, and nothing is signed: UNAUTHENTICATED
without valid credentials (a token or certificate naming no valid service
account included), PERMISSION_DENIED for another identity without that trust,
INVALID_ARGUMENT for a malformed or oversized CSR, an invalid identity, or a
lifetime below zero or above the maximum, FAILED_PRECONDITION once the CA's own
certificate has expired. Signing runs off the event loop, in batches on one
thread (`ThreadBatches`, the lane pilot's SDS mints share): a rollout's burst
of calls costs a hand-off per batch, and no two threads take turns at the GIL.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import grpc

from pilot._gen.istio.v1.auth import ca_pb2
from pilot.decoding import BadRequest, decode
from pilot.limits import Admission, LimitExceeded
from pilot.security.authn import Authenticator, AuthError
from pilot.security.batches import ThreadBatches, signing_lane
from pilot.security.ca import CaExpired, CertificateAuthority, CsrError
from pilot.security.identity import Identity

log = logging.getLogger("pilot.security.ca")

CA_SERVICE = "istio.v1.auth.IstioCertificateService"
IMPERSONATED_IDENTITY = "ImpersonatedIdentity"


@dataclass
class CaStats:
    """What the CA did, with Istio's (citadel) metric names."""

    csr_count: int = 0
    success_cert_issuance_count: int = 0
    authentication_failure_count: int = 0
    csr_error_count: int = 0


def _identity(data: bytes) -> bytes:
    return data


class RequestRefused(Exception):
    """A request the CA will not sign, with the status to answer."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class CaService:
    """Authenticates, authorizes and signs CreateCertificate requests."""

    def __init__(
        self,
        ca: CertificateAuthority,
        authenticator: Authenticator,
        trusted_node_accounts: Iterable[str] = (),
        signing: ThreadBatches | None = None,
        admission: Admission | None = None,
    ) -> None:
        self.ca = ca
        self._authenticator = authenticator
        self._trusted = frozenset(trusted_node_accounts)
        # The lane SDS mints use too (one thread for what holds the GIL): see LocalCa.
        self._signing = signing or signing_lane(asyncio.Semaphore(4))
        self._admission = admission or Admission.unlimited()
        self.in_flight = 0  # requests admitted and not answered yet
        self.stats = CaStats()

    async def create_certificate(
        self, data: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bytes:
        """One CreateCertificate call: admitted, decoded, authenticated, authorized, signed."""
        self.stats.csr_count += 1
        try:
            await self._admit(data, context)
        except LimitExceeded as error:
            self._admission.hits.hit(error, f"CA caller {context.peer()}")
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error))
        self.in_flight += 1
        try:
            response = await self._answer(data, context)
        finally:
            self.in_flight -= 1
        answer: bytes = response.SerializeToString()
        return answer

    async def _admit(self, data: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        limits = self._admission.limits
        await self._admission.rate.admit()
        if len(data) > limits.request_bytes:
            raise LimitExceeded(
                "request_bytes",
                f"a request of {len(data)} bytes, more than {limits.request_bytes}"
                " (PILOT_MAX_REQUEST_BYTES)",
            )
        if self.in_flight >= limits.pending_csrs:
            raise LimitExceeded(
                "pending_csrs",
                f"{limits.pending_csrs} certificate requests are being answered already"
                " (PILOT_MAX_PENDING_CSRS); retry later",
            )

    async def _answer(
        self, data: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ca_pb2.IstioCertificateResponse:
        try:
            request = self._decode(data)
            caller = await self._caller(context)
            identity = self._identity_for(caller, request)
            chain = await self._sign(request, identity)
        except RequestRefused as refused:
            if refused.code == grpc.StatusCode.UNAUTHENTICATED:
                self.stats.authentication_failure_count += 1
            else:
                self.stats.csr_error_count += 1
            log.warning("CA refused %s: %s", context.peer(), refused)
            await context.abort(refused.code, str(refused))
        self.stats.success_cert_issuance_count += 1
        log.info("CA signed a certificate for %s", identity)
        return ca_pb2.IstioCertificateResponse(cert_chain=chain)

    @staticmethod
    def _decode(data: bytes) -> ca_pb2.IstioCertificateRequest:
        try:
            return decode(ca_pb2.IstioCertificateRequest, data)
        except BadRequest as error:
            raise RequestRefused(grpc.StatusCode.INVALID_ARGUMENT, str(error)) from error

    async def _caller(self, context: grpc.aio.ServicerContext[Any, Any]) -> Identity:
        metadata = {
            key: value
            for key, value in context.invocation_metadata() or ()
            if isinstance(value, str)
        }
        try:
            return await self._authenticator.authenticate(metadata, context.auth_context())
        except AuthError as error:
            raise RequestRefused(grpc.StatusCode.UNAUTHENTICATED, str(error)) from error

    def _identity_for(self, caller: Identity, request: ca_pb2.IstioCertificateRequest) -> Identity:
        field = request.metadata.fields.get(IMPERSONATED_IDENTITY)
        wanted = field.string_value if field is not None else ""
        if not wanted or wanted == caller.uri:
            return caller
        if caller.account not in self._trusted:
            raise RequestRefused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{caller} may not ask for another identity ({wanted}):"
                " it is not in CA_TRUSTED_NODE_ACCOUNTS",
            )
        try:
            identity = Identity.parse(wanted)
        except ValueError as error:
            raise RequestRefused(grpc.StatusCode.INVALID_ARGUMENT, str(error)) from error
        if identity.trust_domain != caller.trust_domain:
            raise RequestRefused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{wanted} is outside this CA's trust domain {caller.trust_domain}",
            )
        return identity

    async def _sign(self, request: ca_pb2.IstioCertificateRequest, identity: Identity) -> list[str]:
        try:
            ttl = self.ca.lifetime(request.validity_duration)
            csr = request.csr.encode()
            return await self._signing.run(functools.partial(self.ca.sign, csr, identity, ttl))
        except CsrError as error:
            raise RequestRefused(grpc.StatusCode.INVALID_ARGUMENT, str(error)) from error
        except CaExpired as error:
            raise RequestRefused(grpc.StatusCode.FAILED_PRECONDITION, str(error)) from error

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        method = grpc.unary_unary_rpc_method_handler(
            self.create_certificate,
            request_deserializer=_identity,  # decoded in the handler: garbage is the caller's error
            response_serializer=_identity,
        )
        return grpc.method_handlers_generic_handler(CA_SERVICE, {"CreateCertificate": method})
