"""SDS: the secrets a proxy may read, kept in the cache like clusters and endpoints.

Istio's secret names: `default` (the proxy's certificate chain and private
key) and `ROOTCA` (the trust root). `ROOTCA` is one shared resource; `default`
belongs to one proxy (`ProxyKey`: node id and proven identity) and is stored
under it, so no other proxy's stream can read it.

The certificates come from a `CertificateSource` (pilot's secret manager):
when the first stream of a proxy names `default`, the generator asks the
source for that proxy's identity, and the name is *pending* until the first
certificate is made; when the last stream lets go, the source forgets it and
the secret leaves the cache. A finished mint or rotation reaches the pipeline
as a push request naming the proxy (through the callback the pipeline gave
`watch`); `build` then serializes its new secret once and reports it as that
proxy's own change, so that it fans out to exactly that proxy's streams.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2

from pilot.push.request import Changes, PushRequest
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.proxy import ProxyKey
from pilot.xds.resource import Resource

log = logging.getLogger("pilot.security.sds")

WORKLOAD_SECRET = "default"
ROOT_SECRET = "ROOTCA"


class Certificate(Protocol):
    """A workload certificate chain (leaf first, PEM) and its private key (PEM)."""

    @property
    def chain_pem(self) -> bytes: ...

    @property
    def key_pem(self) -> bytes: ...


class CertificateSource(Protocol):
    """Mints and rotates certificates for the proxies that want one."""

    def want(self, proxy: ProxyKey, ready: Callable[[ProxyKey], None]) -> bool:
        """Start keeping a certificate for the proxy's identity; `ready` after each mint.

        False if it will not (a limit): the source says why in its log.
        """
        ...

    def release(self, proxy: ProxyKey) -> None:
        """Forget the proxy's key and certificate."""
        ...

    def current(self, proxy: ProxyKey) -> Certificate | None: ...

    def root_pem(self) -> str | None: ...


def _certificate_of(proxy: ProxyKey) -> PushRequest:
    return PushRequest(certificates=frozenset((proxy,)))


def workload_secret(certificate: Certificate) -> Resource:
    """The `default` secret: chain and private key."""
    secret = secret_pb2.Secret(name=WORKLOAD_SECRET)
    secret.tls_certificate.certificate_chain.inline_bytes = certificate.chain_pem
    secret.tls_certificate.private_key.inline_bytes = certificate.key_pem
    return Resource.from_message(types.SECRET, WORKLOAD_SECRET, secret)


def root_secret(root_pem: str) -> Resource:
    """The `ROOTCA` secret: a validation context trusting the root."""
    context = common_pb2.CertificateValidationContext()
    context.trusted_ca.inline_bytes = root_pem.encode()
    secret = secret_pb2.Secret(name=ROOT_SECRET, validation_context=context)
    return Resource.from_message(types.SECRET, ROOT_SECRET, secret)


class SecretGenerator:
    """The SDS generator: keeps the cache's secrets in step with the certificate source."""

    type_urls = frozenset({types.SECRET})

    def __init__(self, source: CertificateSource, cache: ResourceCache, stats: XdsStats) -> None:
        self._source = source
        self._cache = cache
        self._stats = stats
        self._root_pem: str | None = None
        self._publish_root()

    def watch(
        self, proxy: ProxyKey, type_url: str, name: str, changed: Callable[[PushRequest], None]
    ) -> bool:
        """The first stream of `proxy` names `name`; `changed` is how its mints reach a push.

        False for a name pilot does not serve (the stream reports those, once).
        """
        if name == ROOT_SECRET:
            return True
        if name != WORKLOAD_SECRET:
            return False
        if proxy.identity is None:
            # A warning, not an error: any client can send this (--xds-auth none, no metadata).
            log.warning("proxy %s asked for its certificate but proved no identity", proxy)
        elif self._source.want(proxy, lambda minted: changed(_certificate_of(minted))):
            self._cache.set_pending(type_url, name, proxy, True)
        return True

    def unwatch(self, proxy: ProxyKey, type_url: str, name: str) -> None:
        """The last stream of `proxy` that named `name` let go of it."""
        if name != WORKLOAD_SECRET:
            return
        self._source.release(proxy)
        self._cache.set_pending(type_url, name, proxy, False)
        self._cache.update(type_url, (), (name,), owner=proxy)

    def build(self, request: PushRequest) -> Changes:
        """Serialize the new certificates of the request's proxies (and a new root)."""
        changes = Changes()
        if not request.certificates:
            return changes
        for proxy in request.certificates:
            certificate = self._source.current(proxy)
            if certificate is None:
                continue  # released meanwhile: nobody wants it any more
            resource = workload_secret(certificate)
            self._stats.serializations[types.SECRET] += 1
            changed = self._cache.update(types.SECRET, (resource,), owner=proxy)
            if changed:
                changes.owned[proxy] = {types.SECRET: changed}
        root = self._publish_root()
        if root:
            changes.shared[types.SECRET] = root
        return changes

    def _publish_root(self) -> set[str]:
        """Store the root if it is new (the first time, or when the source's root changed)."""
        root_pem = self._source.root_pem()
        if root_pem is None or root_pem == self._root_pem:
            return set()
        self._root_pem = root_pem
        self._stats.serializations[types.SECRET] += 1
        return self._cache.update(types.SECRET, (root_secret(root_pem),))
