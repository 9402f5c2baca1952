"""Rotation with a short SECRET_TTL: new certificates arrive before the old ones expire,
and nothing is minted for a secret nobody wants any more.

pilot mints a proxy's next certificate at SECRET_GRACE_PERIOD_RATIO (0.5, +-0.01
jitter) of the current one's lifetime, counted from minting, while some stream wants
it. The waits past a rotation deadline below are the assertion itself (nothing happened
by a time it would have), not a stand-in for synchronisation.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
from dataclasses import dataclass, field
from pathlib import Path

from pilot.security.secrets import SdsSettings, SecretManager
from tests.integration.envoy_tls_view import EnvoyCert, own_certs
from tests.integration.mtls_pair import CLIENT, MESH_SERVICES, SERVER, MtlsPair, mtls_pair
from tests.support.envoy_process import EnvoyProcess, wait_until
from tests.support.mesh import simple_mesh
from tests.support.pilot import RunningPilot, running_pilot
from tests.support.proxies import Proxy
from tests.support.sds_secrets import ROOT, WORKLOAD, served_workload, workload_in
from tests.support.xds_client import SECRET, XdsClient

GRACE = 0.5 + 0.01  # the latest point of a lifetime at which pilot rotates
MARGIN = 1.0  # past a rotation deadline, before concluding nothing happened
BILLING = Proxy.sidecar("billing-1", "shop", "billing")


def short_ttl(seconds: float) -> dict[str, SdsSettings]:
    return {"sds": SdsSettings(ttl=datetime.timedelta(seconds=seconds))}


def secrets_of(pilot: RunningPilot) -> SecretManager:
    security = pilot.discovery.security
    assert security is not None
    return security.secrets


def utcnow() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


async def test_rotation_is_pushed_while_subscribed_and_stops_after_unsubscribe(
    tmp_path: Path,
) -> None:
    ttl = 6.0  # rotation ~3 s after minting, 3 s before expiry
    async with (
        running_pilot(tmp_path, simple_mesh(MESH_SERVICES), security=short_ttl(ttl)) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        secrets = secrets_of(pilot)
        stream = client.delta_sds(BILLING.node())
        await stream.subscribe(SECRET, [WORKLOAD, ROOT])
        first = workload_in(await stream.ack_until(SECRET, [WORKLOAD], ttl))
        received = time.monotonic()

        second = workload_in(await stream.ack_until(SECRET, [WORKLOAD], ttl))
        rotated_after = time.monotonic() - received

        assert utcnow() < first.not_after, "the new certificate came after the old expired"
        assert second.uris == first.uris == (BILLING.uri,)
        assert second.key_matches_leaf
        assert (second.serial, second.key_id) != (first.serial, first.key_id)
        assert second.not_after > first.not_after
        assert rotated_after > 0.3 * ttl, f"rotated only {rotated_after:.2f}s after minting"
        assert (secrets.stats.minted, secrets.stats.rotated) == (2, 1)

        await stream.unsubscribe(SECRET, [WORKLOAD])
        await wait_until(
            lambda: (secrets.stats.dropped, served_workload(secrets, BILLING)),
            5,
            "pilot to drop the unsubscribed certificate",
            until=lambda state: state == (1, None),
        )
        # The dropped certificate was due for rotation GRACE * ttl after it was minted.
        quiet = received + rotated_after + GRACE * ttl + MARGIN - time.monotonic()
        await stream.expect_silence(quiet)
        assert (secrets.stats.minted, secrets.stats.rotated) == (2, 1)
        assert served_workload(secrets, BILLING) is None


# ------------------------------------------------------------------ real Envoys

ENVOY_TTL = 10.0  # rotation ~5 s after each mint; the old certificate is good for 5 s more


@dataclass
class Traffic:
    """Requests sent through the mTLS pair in the background, one handshake each."""

    pair: MtlsPair
    statuses: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    async def run(self) -> None:
        while True:
            try:
                status, _ = await self.pair.get(f"/tick/{len(self.statuses)}")
            except Exception as error:  # every failure is reported, none hidden
                self.failures.append(f"{type(error).__name__}: {error}")
            else:
                self.statuses.append(status)
            await asyncio.sleep(0.1)  # pacing between requests, not synchronisation


async def _rotated(envoy: EnvoyProcess, old: EnvoyCert) -> EnvoyCert:
    """Wait until /certs shows another certificate for the same identity; return it."""
    found = await envoy.wait_for(
        lambda: own_certs(envoy),
        ENVOY_TTL,
        f"a rotated certificate (serial other than {old.serial:x})",
        until=lambda certs: len(certs) == 1 and next(iter(certs)).serial != old.serial,
    )
    new = next(iter(found))
    assert utcnow() < old.expires, f"{envoy.name}: the new certificate came after {old.expires}"
    assert new.uris == old.uris
    assert new.expires > old.expires
    return new


async def _single_cert(envoy: EnvoyProcess) -> EnvoyCert:
    certs = await own_certs(envoy)
    assert len(certs) == 1, certs
    return next(iter(certs))


async def test_envoys_get_new_certificates_before_expiry_and_traffic_flows(
    tmp_path: Path,
) -> None:
    async with running_pilot(
        tmp_path, simple_mesh(MESH_SERVICES), security=short_ttl(ENVOY_TTL)
    ) as pilot:
        secrets = secrets_of(pilot)
        # The other wire variants than test_sds_mtls: SotW ADS for the server's listener,
        # delta ADS and DeltaSecrets for the client and its cluster.
        async with mtls_pair(
            pilot,
            tmp_path,
            server_example="envoy-ads-sotw.yaml",
            client_example="envoy-ads-delta.yaml",
            client_sds_delta=True,
        ) as pair:
            server_old, client_old = (
                await _single_cert(pair.server),
                await _single_cert(pair.client),
            )
            traffic = Traffic(pair)
            sender = asyncio.create_task(traffic.run())
            try:
                server_new, client_new = await asyncio.gather(
                    _rotated(pair.server, server_old), _rotated(pair.client, client_old)
                )
                # A request after the rotation was made with the client's new certificate.
                served = served_workload(secrets, CLIENT)
                assert served is not None
                await wait_until(
                    lambda: [s.xfcc_field("Hash") for s in pair.backend.seen[-3:]],
                    5,
                    "a request with the rotated client certificate",
                    until=lambda hashes: served.leaf_sha256 in hashes,
                )
            finally:
                sender.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sender
            assert traffic.failures == []
            assert traffic.statuses and set(traffic.statuses) == {200}
            assert served.serial == client_new.serial
            server_served = served_workload(secrets, SERVER)
            assert server_served is not None
            assert server_served.serial == server_new.serial
            assert secrets.stats.rotated >= 2

        # Both Envoys are gone: their certificates are dropped and never minted again.
        await wait_until(
            lambda: [served_workload(secrets, p) for p in (SERVER, CLIENT)],
            10,
            "pilot to drop the certificates of the stopped Envoys",
            until=lambda served: served == [None, None],
        )
        gone = time.monotonic()
        minted, rotated, dropped = (
            secrets.stats.minted,
            secrets.stats.rotated,
            secrets.stats.dropped,
        )
        assert dropped == 2
        # Every certificate was minted before `gone`: any rotation was due by then + GRACE * ttl.
        await asyncio.sleep(gone + GRACE * ENVOY_TTL + MARGIN - time.monotonic())
        assert (secrets.stats.minted, secrets.stats.rotated) == (minted, rotated)
        assert [served_workload(secrets, p) for p in (SERVER, CLIENT)] == [None, None]
