"""Who is calling: a Kubernetes service-account token (TokenReview) or a client certificate.

Bearer tokens are checked with a TokenReview (`pilot.security.token_review`)
for the configured audiences; the caller is the service account it names.
Over TLS, a client certificate's SPIFFE URI in the trust domain is accepted
instead. Either way the namespace and service account must be valid Kubernetes
names (`Identity`). Failures raise `AuthError` with a reason the caller can act
on; tokens never appear in messages or logs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from pilot.security.certs import uri_sans, utcnow
from pilot.security.identity import Identity
from pilot.xds.proxy import AuthContext, Unauthenticated

log = logging.getLogger("pilot.security")

__all__ = ["AuthContext", "AuthError", "Authenticator", "TokenReviewer", "bearer_token"]


class AuthError(Unauthenticated):
    """The caller could not be authenticated."""


class TokenReviewer(Protocol):
    """Turns a bearer token into a Kubernetes user name, or raises AuthError."""

    async def review(self, token: str, audiences: Sequence[str]) -> str: ...


def bearer_token(metadata: Mapping[str, str]) -> str | None:
    """The token of an `authorization: Bearer ...` header, if any."""
    header = metadata.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


class Authenticator:
    """Authenticates callers of the CA and of xDS streams."""

    def __init__(
        self,
        trust_domain: str,
        reviewer: TokenReviewer | None,
        audiences: Sequence[str] = ("istio-ca",),
        issuers: Sequence[x509.Certificate] = (),
    ) -> None:
        self.trust_domain = trust_domain
        self._reviewer = reviewer
        self._audiences = tuple(audiences)
        # Client certificates count only if one of these issued them (TLS may not verify).
        self._issuers = tuple(issuers)

    async def from_token(self, token: str) -> Identity:
        if self._reviewer is None:
            raise AuthError("tokens cannot be checked: pilot has no Kubernetes API for TokenReview")
        username = await self._reviewer.review(token, self._audiences)
        try:
            return Identity.from_username(username, self.trust_domain)
        except ValueError as error:
            raise AuthError(f"token does not name a valid service account: {error}") from error

    def from_certificate(self, auth_context: AuthContext) -> Identity | None:
        pem = next(iter(auth_context.get("x509_pem_cert") or ()), None)
        if pem is None:
            return None
        certificate = x509.load_pem_x509_certificate(pem)
        self._check_issued_here(certificate)
        invalid = ""
        for uri in uri_sans(certificate):
            try:
                identity = Identity.parse(uri)
            except ValueError as error:
                if uri.startswith(f"spiffe://{self.trust_domain}/"):
                    invalid = invalid or f": {error}"
                continue
            if identity.trust_domain == self.trust_domain:
                return identity
        raise AuthError(
            f"client certificate has no SPIFFE identity in {self.trust_domain}{invalid}"
        )

    def _check_issued_here(self, certificate: x509.Certificate) -> None:
        now = utcnow()
        if not certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc:
            raise AuthError("client certificate is expired or not yet valid")
        for issuer in self._issuers:
            try:
                certificate.verify_directly_issued_by(issuer)
            except (ValueError, TypeError, InvalidSignature):
                continue
            return
        raise AuthError("client certificate was not issued by this CA")

    async def authenticate(
        self, metadata: Mapping[str, str], auth_context: AuthContext
    ) -> Identity:
        """The caller's identity: from its token if it sent one, else its client certificate."""
        token = bearer_token(metadata)
        if token is not None:
            return await self.from_token(token)
        identity = self.from_certificate(auth_context)
        if identity is None:
            raise AuthError(
                "no credentials: send a service-account token as 'authorization: Bearer <token>'"
                " or present a client certificate"
            )
        return identity
