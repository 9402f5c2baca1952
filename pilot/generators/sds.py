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
as a push request naming the proxy; `build` then serializes its new secret
once and reports it, so that it fans out to exactly that proxy's streams.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2

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

    def want(self, proxy: ProxyKey, ready: Callable[[ProxyKey], None]) -> None:
        """Start keeping a certificate for the proxy's identity; `ready` after each mint."""
        ...

    def release(self, proxy: ProxyKey) -> None:
        """Forget the proxy's key and certificate."""
        ...

    def current(self, proxy: ProxyKey) -> Certificate | None: ...

    def root_pem(self) -> str | None: ...


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
    """Keeps the cache's secrets in step with the certificate source."""

    def __init__(
        self,
        source: CertificateSource,
        cache: ResourceCache,
        stats: XdsStats,
        ready: Callable[[ProxyKey], None],
    ) -> None:
        self._source = source
        self._cache = cache
        self._stats = stats
        self._ready = ready
        self._root_pem: str | None = None
        self._publish_root()

    def watch(self, proxy: ProxyKey, name: str) -> None:
        """The first stream of `proxy` names `name`."""
        if name == ROOT_SECRET:
            return
        if name != WORKLOAD_SECRET:
            log.warning(
                "proxy %s asked for secret %r; pilot serves default and ROOTCA", proxy, name
            )
        elif proxy.identity is None:
            log.error("proxy %s asked for its certificate but proved no identity", proxy)
        else:
            self._cache.set_pending(types.SECRET, name, proxy, True)
            self._source.want(proxy, self._ready)

    def unwatch(self, proxy: ProxyKey, name: str) -> None:
        """The last stream of `proxy` that named `name` let go of it."""
        if name != WORKLOAD_SECRET:
            return
        self._source.release(proxy)
        self._cache.set_pending(types.SECRET, name, proxy, False)
        self._cache.update(types.SECRET, (), (name,), owner=proxy)

    def build(self, proxies: Iterable[ProxyKey]) -> tuple[set[str], dict[ProxyKey, set[str]]]:
        """Serialize the new certificates of these proxies; returns (shared, owned) changes."""
        owned: dict[ProxyKey, set[str]] = {}
        for proxy in proxies:
            certificate = self._source.current(proxy)
            if certificate is None:
                continue  # released meanwhile: nobody wants it any more
            resource = workload_secret(certificate)
            self._stats.serializations[types.SECRET] += 1
            changed = self._cache.update(types.SECRET, (resource,), owner=proxy)
            if changed:
                owned[proxy] = changed
        return self._publish_root(), owned

    def _publish_root(self) -> set[str]:
        """Store the root if it is new (a remote CA's root is learned from its chains)."""
        root_pem = self._source.root_pem()
        if root_pem is None or root_pem == self._root_pem:
            return set()
        self._root_pem = root_pem
        self._stats.serializations[types.SECRET] += 1
        return self._cache.update(types.SECRET, (root_secret(root_pem),))
