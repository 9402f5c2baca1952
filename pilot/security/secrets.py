"""The secret manager: workload certificates minted on demand, rotated while wanted.

Istio's secret names: `default` (the proxy's certificate chain and private key)
and `ROOTCA` (the trust root). Nothing is minted until a proxy subscribes to
`default`; then pilot makes a key and a CSR for the proxy's identity (off the
event loop, a bounded number at once) and has the CA sign it. Each proxy (one
Envoy node id) gets its own key. While any stream of the proxy still names the
secret, the same certificate is served and a new one is minted at
SECRET_GRACE_PERIOD_RATIO of its lifetime; when the last stream lets go, key
and certificate are forgotten and never pushed again. CA failures are retried
with backoff; no empty or unverified secret is ever served.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cryptography.hazmat.primitives import serialization
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, secret_pb2

from pilot.backoff import Backoff
from pilot.security.ca_client import CaClient, CaError
from pilot.security.certs import (
    KeyType,
    key_matches,
    load_certificates,
    new_key_and_csr,
    utcnow,
)
from pilot.security.identity import Identity
from pilot.xds import types
from pilot.xds.resource import Resource

log = logging.getLogger("pilot.security.sds")

WORKLOAD_SECRET = "default"
ROOT_SECRET = "ROOTCA"

OnSecretChange = Callable[[str, str], None]  # (proxy id, secret name)


@dataclass(frozen=True, slots=True)
class SdsSettings:
    """--key-type, SECRET_TTL, SECRET_GRACE_PERIOD_RATIO, and minting bounds."""

    key_type: KeyType = KeyType.EC
    ttl: datetime.timedelta = datetime.timedelta(hours=24)
    grace_ratio: float = 0.5
    grace_jitter: float = 0.01
    max_concurrent_mints: int = 8
    retry_initial: float = 0.5
    retry_max: float = 30.0


@dataclass
class SecretStats:
    """Counts of what the secret manager did."""

    minted: int = 0
    rotated: int = 0
    dropped: int = 0
    ca_errors: int = 0


@dataclass
class _Workload:
    """One proxy's `default` secret: who wants it, the current one, the task keeping it fresh."""

    identity: Identity
    holders: set[int] = field(default_factory=set)
    resource: Resource | None = None
    serial: int = 0
    task: asyncio.Task[None] | None = None


def _workload_secret(chain: list[str], key_pem: bytes) -> Resource:
    secret = secret_pb2.Secret(name=WORKLOAD_SECRET)
    secret.tls_certificate.certificate_chain.inline_bytes = "".join(chain).encode()
    secret.tls_certificate.private_key.inline_bytes = key_pem
    return Resource.from_message(types.SECRET, WORKLOAD_SECRET, secret)


def root_secret(root_pem: str) -> Resource:
    """The `ROOTCA` secret: a validation context trusting the root."""
    context = common_pb2.CertificateValidationContext()
    context.trusted_ca.inline_bytes = root_pem.encode()
    secret = secret_pb2.Secret(name=ROOT_SECRET, validation_context=context)
    return Resource.from_message(types.SECRET, ROOT_SECRET, secret)


class SecretManager:
    """Per-proxy workload secrets and the shared trust root."""

    def __init__(
        self,
        ca: CaClient,
        root_pem: str | None,
        settings: SdsSettings,
        on_change: OnSecretChange,
    ) -> None:
        self._ca = ca
        self._settings = settings
        self._on_change = on_change
        self._mint_slots = asyncio.Semaphore(settings.max_concurrent_mints)
        self._workloads: dict[str, _Workload] = {}
        self._root_holders: dict[str, set[int]] = {}
        self._root: Resource | None = root_secret(root_pem) if root_pem else None
        self._version = 0
        self.stats = SecretStats()
        self.observe_ca_latency: Callable[[float], None] = lambda seconds: None

    # -- what streams ask ------------------------------------------------------

    def version(self) -> str:
        return str(self._version)

    def get(self, proxy_id: str, name: str) -> Resource | None:
        if name == ROOT_SECRET:
            return self._root
        if name == WORKLOAD_SECRET:
            workload = self._workloads.get(proxy_id)
            return workload.resource if workload else None
        return None

    def pending(self, proxy_id: str, name: str) -> bool:
        """True while this proxy's `default` is wanted but not minted yet."""
        workload = self._workloads.get(proxy_id)
        return name == WORKLOAD_SECRET and workload is not None and workload.resource is None

    def names(self, proxy_id: str) -> list[str]:
        return [n for n in (WORKLOAD_SECRET, ROOT_SECRET) if self.get(proxy_id, n) is not None]

    def want(self, proxy_id: str, identity: Identity | None, name: str, holder: int) -> None:
        """A stream of `proxy_id` names `name`; the first to want `default` starts minting."""
        if name == ROOT_SECRET:
            self._root_holders.setdefault(proxy_id, set()).add(holder)
        elif name != WORKLOAD_SECRET:
            log.warning(
                "proxy %s asked for secret %r; pilot serves default and ROOTCA", proxy_id, name
            )
        elif identity is None:
            log.error("proxy %s asked for its certificate but has no identity", proxy_id)
        else:
            self._want_workload(proxy_id, identity, holder)

    def release(self, proxy_id: str, name: str, holder: int) -> None:
        """A stream no longer names `name`; the last to let go of `default` drops it."""
        if name == ROOT_SECRET:
            holders = self._root_holders.get(proxy_id, set())
            holders.discard(holder)
            if not holders:
                self._root_holders.pop(proxy_id, None)
            return
        workload = self._workloads.get(proxy_id)
        if name != WORKLOAD_SECRET or workload is None:
            return
        workload.holders.discard(holder)
        if not workload.holders:
            self._drop(proxy_id, workload)

    async def close(self) -> None:
        for proxy_id, workload in list(self._workloads.items()):
            self._drop(proxy_id, workload)

    # -- minting and rotation ----------------------------------------------------

    def _want_workload(self, proxy_id: str, identity: Identity, holder: int) -> None:
        workload = self._workloads.get(proxy_id)
        if workload is not None and workload.identity != identity:
            log.warning("proxy %s changed identity to %s: minting anew", proxy_id, identity)
            self._drop(proxy_id, workload)
            workload = None
        if workload is None:
            workload = self._workloads[proxy_id] = _Workload(identity)
            workload.task = asyncio.create_task(
                self._maintain(proxy_id, workload), name=f"sds-{proxy_id}"
            )
        workload.holders.add(holder)

    def _drop(self, proxy_id: str, workload: _Workload) -> None:
        if self._workloads.get(proxy_id) is workload:
            del self._workloads[proxy_id]
        if workload.task is not None:
            workload.task.cancel()
        if workload.resource is not None:
            self.stats.dropped += 1
            log.info("dropped the certificate of proxy %s (no longer wanted)", proxy_id)
        workload.resource = None

    async def _maintain(self, proxy_id: str, workload: _Workload) -> None:
        """Mint now, then again at the grace period, for as long as the task lives."""
        while True:
            chain, key_pem, created = await self._mint_until_signed(proxy_id, workload.identity)
            rotation = workload.resource is not None
            workload.resource = _workload_secret(chain, key_pem)
            leaf = load_certificates(chain[0].encode())[0]
            workload.serial = leaf.serial_number
            self._learn_root(chain)
            self._bump()
            if rotation:
                self.stats.rotated += 1
            self.stats.minted += 1
            log.info(
                "%s certificate for proxy %s (%s), serial %x, expires %s",
                "rotated" if rotation else "minted",
                proxy_id,
                workload.identity,
                leaf.serial_number,
                leaf.not_valid_after_utc.isoformat(),
            )
            self._on_change(proxy_id, WORKLOAD_SECRET)
            await asyncio.sleep(self._until_rotation(created, leaf.not_valid_after_utc))

    def _until_rotation(self, created: datetime.datetime, expires: datetime.datetime) -> float:
        settings = self._settings
        ratio = settings.grace_ratio + random.uniform(-settings.grace_jitter, settings.grace_jitter)
        rotate_at = expires - (expires - created) * ratio
        return max((rotate_at - utcnow()).total_seconds(), 0.0)

    async def _mint_until_signed(
        self, proxy_id: str, identity: Identity
    ) -> tuple[list[str], bytes, datetime.datetime]:
        backoff = Backoff(self._settings.retry_initial, self._settings.retry_max)
        while True:
            try:
                return await self._mint(identity)
            except CaError as error:
                self.stats.ca_errors += 1
                delay = backoff.next_delay()
                log.warning(
                    "cannot get a certificate for proxy %s (%s): %s; retrying in %.1fs",
                    proxy_id,
                    identity,
                    error,
                    delay,
                )
                await asyncio.sleep(delay)

    async def _mint(self, identity: Identity) -> tuple[list[str], bytes, datetime.datetime]:
        async with self._mint_slots:
            key_pem, csr = await asyncio.to_thread(
                new_key_and_csr, self._settings.key_type, [identity.uri]
            )
        created = utcnow()
        started = time.monotonic()
        chain = await self._ca.sign(csr, identity, self._settings.ttl)
        self.observe_ca_latency(time.monotonic() - started)
        leaf = load_certificates(chain[0].encode())[0]
        if not key_matches(serialization.load_pem_private_key(key_pem, password=None), leaf):
            raise CaError("the CA signed a different key than the one in the CSR")
        return chain, key_pem, created

    def _learn_root(self, chain: list[str]) -> None:
        """With no configured root, trust the root the CA's chains end in."""
        if self._root is not None:
            return
        self._root = root_secret(chain[-1])
        self._bump()
        for proxy_id in list(self._root_holders):
            self._on_change(proxy_id, ROOT_SECRET)

    def _bump(self) -> None:
        self._version += 1
