"""Who an xDS stream speaks for: `--xds-auth none` or `--xds-auth kubernetes`.

- `none` (the default with `--config`): the identity is taken from node metadata
  `NAMESPACE` and `SERVICE_ACCOUNT`, trusted as given (pilot says so at start).
- `kubernetes` (the default with the Kubernetes registry): every stream carries
  a service-account token in `authorization: Bearer`, checked by TokenReview;
  node metadata, where present, must name the same account.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from enum import StrEnum
from typing import Protocol

from envoy.config.core.v3 import base_pb2

from pilot.security.authn import Authenticator, AuthError, bearer_token
from pilot.security.identity import Identity

log = logging.getLogger("pilot.security")


class XdsAuth(StrEnum):
    """How xDS callers are identified."""

    NONE = "none"
    KUBERNETES = "kubernetes"


class IdentityMismatch(Exception):
    """Node metadata claims an identity the stream's credentials do not carry."""


def _metadata_identity(node: base_pb2.Node, trust_domain: str) -> Identity | None:
    fields = node.metadata.fields
    namespace = fields["NAMESPACE"].string_value if "NAMESPACE" in fields else ""
    account = fields["SERVICE_ACCOUNT"].string_value if "SERVICE_ACCOUNT" in fields else ""
    if not namespace or not account:
        return None
    return Identity(trust_domain, namespace, account)


class IdentityPolicy(Protocol):
    """How the hub learns who a stream speaks for."""

    async def from_credentials(self, metadata: Mapping[str, str]) -> Identity | None: ...

    def for_node(self, node: base_pb2.Node, credential: Identity | None) -> Identity | None: ...


class FixedIdentity:
    """`pilot agent`: every Envoy on the node is the pod's one workload identity."""

    def __init__(self, identity: Identity) -> None:
        self.identity = identity

    async def from_credentials(self, metadata: Mapping[str, str]) -> Identity | None:
        return self.identity

    def for_node(self, node: base_pb2.Node, credential: Identity | None) -> Identity | None:
        return self.identity


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

    async def from_credentials(self, metadata: Mapping[str, str]) -> Identity | None:
        """At stream start: the token's identity (kubernetes mode), or None (none mode)."""
        if self.mode is XdsAuth.NONE:
            return None
        token = bearer_token(metadata)
        if token is None:
            raise AuthError(
                "xDS streams must carry a service-account token (authorization: Bearer)"
            )
        assert self._authenticator is not None
        return await self._authenticator.from_token(token)

    def for_node(self, node: base_pb2.Node, credential: Identity | None) -> Identity | None:
        """At the first request: the stream's identity, checking node metadata against it.

        Each of NAMESPACE and SERVICE_ACCOUNT, where present, must match the token.
        """
        if self.mode is XdsAuth.NONE:
            return _metadata_identity(node, self.trust_domain)
        fields = node.metadata.fields
        token = (credential.namespace, credential.service_account) if credential else ("", "")
        claimed = tuple(
            fields[key].string_value if key in fields else ""
            for key in ("NAMESPACE", "SERVICE_ACCOUNT")
        )
        differing = [
            key
            for key, mine, theirs in zip(
                ("NAMESPACE", "SERVICE_ACCOUNT"), claimed, token, strict=True
            )
            if mine and mine != theirs
        ]
        if differing:
            account = "/".join(mine or theirs for mine, theirs in zip(claimed, token, strict=True))
            raise IdentityMismatch(
                f"node metadata claims {account} but the token is {'/'.join(token)}"
                f" ({', '.join(differing)} differ)"
            )
        return credential
