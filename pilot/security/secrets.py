"""The secret manager: workload certificates minted on demand, rotated while wanted.

A certificate belongs to one proxy (`ProxyKey`: node id and the identity the
proxy *proved*), and names that identity. Nothing is minted until the SDS
generator asks (the first stream of the proxy names `default`); then pilot
makes a key and a CSR (off the event loop, a bounded number at once) and has
the CA sign it. With pilot's own CA there is no CSR: key and certificate are
made together in one thread hand-off (`LocalCa.mint`), the key never having
left that call. While wanted, a new one is minted at SECRET_GRACE_PERIOD_RATIO
of its lifetime; after each mint the manager calls the `ready` callback it was
given, which hands the proxy to the push pipeline. When released, key and
certificate are forgotten. CA failures are retried with backoff; a chain that
does not match the key is never kept. A workload holds no task: its mint is a
future with a callback, its next rotation or retry a timer on the loop, since a
rollout brings thousands of proxies at once. Anything a mint raises (a CA's
answer no check foresaw, say) is logged at ERROR with its traceback and the
mint retried with backoff, so the workload is renewed for as long as it is
wanted.

The trust root (`ROOTCA`) is the one the manager is given: pilot's own CA's,
or the configured root of a remote CA. It never comes from a CA's answer.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization

from pilot import logs
from pilot.limits import Admission, LimitExceeded
from pilot.runtime.backoff import Backoff
from pilot.runtime.supervisor import describe
from pilot.security.ca_client import CaClient, CaError, LocalCa
from pilot.security.certs import (
    KeyType,
    WorkloadCertificate,
    key_matches,
    load_certificates,
    new_key_and_csr,
    utcnow,
)
from pilot.security.identity import Identity
from pilot.xds.proxy import ProxyKey

log = logging.getLogger("pilot.security.sds")

Ready = Callable[[ProxyKey], None]


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
    """One proxy's certificate: the current one, and the mint or timer renewing it."""

    identity: Identity
    ready: Ready
    certificate: WorkloadCertificate | None = None
    minting: asyncio.Future[WorkloadCertificate] | None = None
    timer: asyncio.TimerHandle | None = None  # the next rotation, or a failed mint's retry
    backoff: Backoff | None = None  # only while mints fail


class SecretManager:
    """Per-proxy workload certificates and the trust root."""

    def __init__(
        self,
        ca: CaClient,
        root_pem: str,
        settings: SdsSettings,
        observe_ca_latency: Callable[[float], None] = lambda seconds: None,
        admission: Admission | None = None,
    ) -> None:
        self._ca = ca
        # pilot's own CA makes key and certificate in one step; any other gets a CSR.
        self._local = ca if isinstance(ca, LocalCa) else None
        self._settings = settings
        self._observe_ca_latency = observe_ca_latency
        self._admission = admission or Admission.unlimited()
        self._mint_slots = asyncio.Semaphore(settings.max_concurrent_mints)
        self._workloads: dict[ProxyKey, _Workload] = {}
        self._per_identity: Counter[str] = Counter()
        self._root_pem = root_pem
        self.stats = SecretStats()

    # -- the SDS generator's view (CertificateSource) ----------------------------

    def want(self, proxy: ProxyKey, ready: Ready) -> bool:
        """Keep a certificate for the proxy's proven identity; `ready(proxy)` after each mint.

        False when a limit on live keys refuses it (counted and logged).
        """
        if proxy in self._workloads:
            return True
        if proxy.identity is None:
            raise ValueError(f"proxy {proxy} proved no identity: no certificate for it")
        try:
            self._check_limits(proxy.identity)
        except LimitExceeded as error:
            self._admission.hits.hit(error, f"proxy {proxy}")
            return False
        workload = self._workloads[proxy] = _Workload(Identity.parse(proxy.identity), ready)
        self._per_identity[proxy.identity] += 1
        self._mint_for(proxy, workload)
        return True

    def _check_limits(self, identity: str) -> None:
        limits = self._admission.limits
        if len(self._workloads) >= limits.certificates:
            raise LimitExceeded(
                "certificates",
                f"{limits.certificates} workload keys live already (PILOT_MAX_CERTIFICATES)",
            )
        if self._per_identity[identity] >= limits.certificates_per_identity:
            raise LimitExceeded(
                "certificates_per_identity",
                f"{limits.certificates_per_identity} workload keys live for {identity} already"
                " (PILOT_MAX_CERTIFICATES_PER_IDENTITY)",
            )

    def release(self, proxy: ProxyKey) -> None:
        """Forget the proxy's key and certificate (stop rotating them)."""
        workload = self._workloads.pop(proxy, None)
        if workload is None:
            return
        self._per_identity[workload.identity.uri] -= 1
        if not self._per_identity[workload.identity.uri]:
            del self._per_identity[workload.identity.uri]
        minting, workload.minting = workload.minting, None  # its callback now sees it gone
        if minting is not None:
            minting.cancel()
        if workload.timer is not None:
            workload.timer.cancel()
        if workload.certificate is not None:
            self.stats.dropped += 1
            logs.info(log, "dropped the certificate of proxy %s (no longer wanted)", proxy)
        workload.certificate = None

    def current(self, proxy: ProxyKey) -> WorkloadCertificate | None:
        workload = self._workloads.get(proxy)
        return workload.certificate if workload is not None else None

    def root_pem(self) -> str:
        return self._root_pem

    def serial(self, proxy: ProxyKey) -> int | None:
        """The serial number of the proxy's current certificate (for logs and tests)."""
        certificate = self.current(proxy)
        return certificate.serial if certificate is not None else None

    async def close(self) -> None:
        for proxy in list(self._workloads):
            self.release(proxy)

    # -- minting and rotation ----------------------------------------------------

    def _mint_for(self, proxy: ProxyKey, workload: _Workload) -> None:
        """Start the workload's next mint; `_minted` takes it from there."""
        workload.timer = None
        created, started = utcnow(), time.monotonic()
        if self._local is not None:
            settings = self._settings
            minting = self._local.mint_soon(settings.key_type, workload.identity, settings.ttl)
        else:
            minting = asyncio.get_running_loop().create_task(
                self._mint_with_csr(workload.identity), name=f"sds-{proxy.node_id}"
            )
        workload.minting = minting
        minted = functools.partial(self._minted, proxy, workload, created, started)
        minting.add_done_callback(minted)

    def _minted(
        self,
        proxy: ProxyKey,
        workload: _Workload,
        created: datetime.datetime,
        started: float,
        minting: asyncio.Future[WorkloadCertificate],
    ) -> None:
        """A mint ended: keep its certificate and time the next, or retry with backoff."""
        if workload.minting is not minting:  # released meanwhile
            if not minting.cancelled():
                minting.exception()  # seen: it had ended before `release` could cancel it
            return
        workload.minting = None
        # Cancelled, yet not released: the lane stopped under it (pilot stopping, say).
        error = minting.exception() if not minting.cancelled() else None
        if error is not None or minting.cancelled():
            self._retry(proxy, workload, error)
            return
        if self._local is not None:
            self._observe_ca_latency(time.monotonic() - started)  # a remote CA's is its call's
        certificate = minting.result()
        rotation = workload.certificate is not None
        workload.certificate, workload.backoff = certificate, None
        self.stats.minted += 1
        if rotation:
            self.stats.rotated += 1
        logs.info(
            log,
            "%s certificate for proxy %s, serial %x, expires %s",
            "rotated" if rotation else "minted",
            proxy,
            certificate.serial,
            certificate.expires.isoformat(),
        )
        # The timer first: a `ready` that raised must not leave the certificate unrenewed.
        workload.timer = asyncio.get_running_loop().call_later(
            self._until_rotation(created, certificate.expires), self._mint_for, proxy, workload
        )
        workload.ready(proxy)

    def _retry(self, proxy: ProxyKey, workload: _Workload, error: BaseException | None) -> None:
        """A mint that failed (`error`; None: cancelled) is tried again after a backoff,
        for as long as it is wanted."""
        if workload.backoff is None:
            workload.backoff = Backoff(self._settings.retry_initial, self._settings.retry_max)
        delay = workload.backoff.next_delay()
        if error is None:
            log.debug("the mint for proxy %s was cancelled; retrying in %.1fs", proxy, delay)
        elif isinstance(error, CaError):
            self.stats.ca_errors += 1
            log.warning(
                "cannot get a certificate for proxy %s: %s; retrying in %.1fs", proxy, error, delay
            )
        else:  # a fault of pilot's or an answer nobody checked for: loudly
            self.stats.ca_errors += 1
            log.error(
                "cannot get a certificate for proxy %s: %s; retrying in %.1fs",
                proxy,
                describe(error),
                delay,
                exc_info=error,
            )
        workload.timer = asyncio.get_running_loop().call_later(
            delay, self._mint_for, proxy, workload
        )

    def _until_rotation(self, created: datetime.datetime, expires: datetime.datetime) -> float:
        settings = self._settings
        ratio = settings.grace_ratio + random.uniform(-settings.grace_jitter, settings.grace_jitter)
        rotate_at = expires - (expires - created) * ratio
        return max((rotate_at - utcnow()).total_seconds(), 0.0)

    async def _mint_with_csr(self, identity: Identity) -> WorkloadCertificate:
        """A key and CSR made here, signed by the CA; its answer checked against the key."""
        async with self._mint_slots:
            key_pem, csr = await asyncio.to_thread(
                new_key_and_csr, self._settings.key_type, [identity.uri]
            )
        started = time.monotonic()
        chain = await self._ca.sign(csr, identity, self._settings.ttl)
        self._observe_ca_latency(time.monotonic() - started)
        async with self._mint_slots:
            return await asyncio.to_thread(_certificate_of, key_pem, chain)


def _certificate_of(key_pem: bytes, chain: list[str]) -> WorkloadCertificate:
    """The chain as SDS serves it, once its leaf is seen to certify the key (in a thread:
    parsing a private key, an RSA one above all, is crypto too)."""
    leaf = load_certificates(chain[0].encode())[0]
    if not key_matches(serialization.load_pem_private_key(key_pem, password=None), leaf):
        raise CaError("the CA signed a different key than the one in the CSR")
    return WorkloadCertificate(
        "".join(chain).encode(), key_pem, leaf.serial_number, leaf.not_valid_after_utc
    )
