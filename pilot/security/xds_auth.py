"""Who an xDS stream speaks for: `--xds-auth none` or `--xds-auth kubernetes`.

- `none` (the default with `--config`): the identity is taken from node metadata
  `NAMESPACE` and `SERVICE_ACCOUNT`, trusted as given (pilot says so at start).
- `kubernetes` (the default with a Kubernetes source): every stream proves
  who it is with a service-account token in `authorization: Bearer`, checked by
  TokenReview, or with a client certificate issued by pilot's CA. Node metadata
  NAMESPACE and SERVICE_ACCOUNT, each where present, must name the same
  account, else the stream is refused; a field left out is taken from the
  proof, never from the claim.

In both modes a NAMESPACE or SERVICE_ACCOUNT that is not a valid Kubernetes
name refuses the stream (PERMISSION_DENIED).

Both implement `pilot.xds.proxy.ProxyAuthenticator`; identities are SPIFFE URIs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from pilot.security.authn import Authenticator, AuthError, bearer_token
from pilot.security.identity import Identity, check_namespace, check_service_account
from pilot.xds.proxy import AuthContext, PermissionDenied

log = logging.getLogger("pilot.security")

_CLAIMS = ("NAMESPACE", "SERVICE_ACCOUNT")


class XdsAuth(StrEnum):
    """How xDS callers are identified."""

    NONE = "none"
    KUBERNETES = "kubernetes"


class IdentityMismatch(PermissionDenied):
    """Node metadata claims an identity the stream's credentials do not carry."""


class InvalidClaim(PermissionDenied):
    """Node metadata NAMESPACE or SERVICE_ACCOUNT is not a valid Kubernetes name."""


def _claims(node: Any) -> tuple[str, str]:
    """(NAMESPACE, SERVICE_ACCOUNT) from node metadata; '' where absent.

    Raises InvalidClaim when one is present but not a valid Kubernetes name.
    """
    fields = node.metadata.fields
    namespace, account = (fields[key].string_value if key in fields else "" for key in _CLAIMS)
    for key, value, check in zip(
        _CLAIMS, (namespace, account), (check_namespace, check_service_account), strict=True
    ):
        if value:
            try:
                check(value)
            except ValueError as error:
                raise InvalidClaim(f"node metadata {key}: {error}") from error
    return namespace, account


class FixedIdentity:
    """`pilot agent`: every Envoy on the node is the pod's one workload identity."""

    def __init__(self, identity: Identity) -> None:
        self.identity = identity

    async def credential(
        self, metadata: Mapping[str, str], auth_context: AuthContext
    ) -> str | None:
        return self.identity.uri

    def identity_of(self, node: Any, credential: str | None) -> str | None:
        return self.identity.uri


class ProxyIdentities:
    """Decides the identity of each xDS stream."""

    def __init__(
        self, mode: XdsAuth, trust_domain: str, authenticator: Authenticator | None
    ) -> None:
        self.mode = mode
        self.trust_domain = trust_domain
        self._authenticator = authenticator
        if mode is XdsAuth.NONE:
            log.warning(
                "--xds-auth none: proxies are trusted to be who their node metadata"
                " (NAMESPACE, SERVICE_ACCOUNT) says"
            )
        elif authenticator is None:
            raise ValueError("--xds-auth kubernetes needs a Kubernetes API for TokenReview")

    async def credential(
        self, metadata: Mapping[str, str], auth_context: AuthContext
    ) -> str | None:
        """At stream start: what the stream proved (kubernetes mode), or None (none mode)."""
        if self.mode is XdsAuth.NONE:
            return None
        assert self._authenticator is not None
        if bearer_token(metadata) is None and not auth_context.get("x509_pem_cert"):
            raise AuthError(
                "xDS streams must carry a service-account token (authorization: Bearer)"
                " or a client certificate from pilot's CA"
            )
        identity = await self._authenticator.authenticate(metadata, auth_context)
        return identity.uri

    def identity_of(self, node: Any, credential: str | None) -> str | None:
        """At the first request: the stream's identity, its node metadata checked against it."""
        claimed = _claims(node)
        if self.mode is XdsAuth.NONE:
            namespace, account = claimed
            if not namespace or not account:
                return None
            return Identity(self.trust_domain, namespace, account).uri
        if credential is None:
            return None
        proven = Identity.parse(credential)
        proof = (proven.namespace, proven.service_account)
        differing = [
            key
            for key, mine, theirs in zip(_CLAIMS, claimed, proof, strict=True)
            if mine and mine != theirs
        ]
        if differing:
            account = "/".join(mine or theirs for mine, theirs in zip(claimed, proof, strict=True))
            raise IdentityMismatch(
                f"node metadata claims {account} but the credentials are {'/'.join(proof)}"
                f" ({', '.join(differing)} differ)"
            )
        return credential
