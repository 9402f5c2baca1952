"""A workload certificate lives exactly as long as some stream of its proxy wants it.

Protocol level, with real gRPC streams (SotW and delta, over ADS and over the
SecretDiscoveryService): the first subscription to `default` mints a key and a
certificate for the proxy's SPIFFE identity; asking again while subscribed gets the same
one; when no stream of the proxy names it any more (unsubscribe, an empty list, the
stream's end) it is dropped and never pushed again, and a later subscription gets a new
key. Proxies never share a key, even with one service account.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pilot.security.certs import KeyType
from pilot.security.secrets import SdsSettings, SecretManager
from tests.integration.mtls_pair import MESH_SERVICES
from tests.support.envoy_process import wait_until
from tests.support.mesh import simple_mesh
from tests.support.pilot import RunningPilot, running_pilot
from tests.support.proxies import Proxy
from tests.support.sds_secrets import (
    ROOT,
    WORKLOAD,
    WorkloadCert,
    root_in,
    served_workload,
    workload_in,
)
from tests.support.xds_client import SECRET, DeltaStream, SotwStream, XdsClient

ORDERS = Proxy.sidecar("orders-1", "shop", "orders")
WAIT = 10.0
# (service, delta): every RPC that can carry secrets.
VARIANTS = [("ads", False), ("ads", True), ("sds", False), ("sds", True)]
VARIANT_IDS = ["ads-sotw", "ads-delta", "sds-sotw", "sds-delta"]
Stream = SotwStream | DeltaStream


@pytest.fixture
async def pilot(tmp_path: Path) -> AsyncIterator[RunningPilot]:
    async with running_pilot(tmp_path, simple_mesh(MESH_SERVICES)) as running:
        yield running


@pytest.fixture
async def client(pilot: RunningPilot) -> AsyncIterator[XdsClient]:
    async with XdsClient(pilot.grpc_target) as xds:
        yield xds


def open_stream(client: XdsClient, proxy: Proxy, service: str, delta: bool) -> Stream:
    """A stream of `proxy` for secrets: over ADS or the SecretDiscoveryService, SotW or delta."""
    if service == "ads":
        return client.delta_ads(proxy.node()) if delta else client.ads(proxy.node())
    return client.delta_sds(proxy.node()) if delta else client.sds(proxy.node())


async def ask(stream: Stream, names: list[str]) -> None:
    """Want these secrets too: delta subscribes to them; SotW sends its whole list again."""
    if isinstance(stream, DeltaStream):
        await stream.subscribe(SECRET, names)
        return
    wanted = stream.names.get(SECRET, [])
    await stream.subscribe(SECRET, [*wanted, *(n for n in names if n not in wanted)])


def secrets_of(pilot: RunningPilot) -> SecretManager:
    security = pilot.discovery.security
    assert security is not None
    return security.secrets


def assert_fresh_certificate(cert: WorkloadCert, proxy: Proxy, pilot: RunningPilot) -> None:
    """A well-formed workload certificate for `proxy`, issued by pilot's CA just now."""
    security = pilot.discovery.security
    assert security is not None
    assert cert.uris == (proxy.uri,)
    assert cert.key_matches_leaf, "the private key does not belong to the certificate"
    assert cert.signed_by(security.ca.root_pem), "the chain does not verify to pilot's root"
    now = datetime.datetime.now(datetime.UTC)
    assert cert.not_before <= now < cert.not_after
    assert cert.not_after - now > datetime.timedelta(hours=23)  # SECRET_TTL 24h by default


async def subscribe_both(stream: Stream, pilot: RunningPilot) -> WorkloadCert:
    """Ask for `default` and `ROOTCA`; return the certificate once both have arrived."""
    await ask(stream, [WORKLOAD, ROOT])
    arrived = await stream.ack_until(SECRET, [WORKLOAD, ROOT], WAIT)
    security = pilot.discovery.security
    assert security is not None
    sent = (arrived.times[ROOT], root_in(arrived))
    assert sent == (1, security.ca.root_pem), f"ROOTCA sent {sent[0]} times, or another root"
    return workload_in(arrived)


async def assert_nothing_pending(stream: Stream) -> None:
    """A barrier: ask for ROOTCA anew; the answer must carry it alone.

    Pilot handles one stream's requests in order and sends everything owed at once, so a
    `default` still owed to this stream would come before or with this answer.
    """
    await stream.unsubscribe(SECRET, [ROOT])
    await ask(stream, [ROOT])
    answer = await stream.ack_until(SECRET, [ROOT], WAIT)
    assert (answer.responses, answer.names, answer.removed) == (1, [ROOT], []), answer


async def wait_dropped(pilot: RunningPilot, proxy: Proxy, dropped: int) -> None:
    """Wait until pilot has dropped `dropped` certificates and serves `proxy` none."""
    secrets = secrets_of(pilot)
    await wait_until(
        lambda: (secrets.stats.dropped, served_workload(secrets, proxy)),
        WAIT,
        f"pilot to drop the certificate of {proxy.node_id}",
        until=lambda state: state == (dropped, None),
    )


@pytest.mark.parametrize(("service", "delta"), VARIANTS, ids=VARIANT_IDS)
async def test_same_certificate_while_subscribed(
    pilot: RunningPilot, client: XdsClient, service: str, delta: bool
) -> None:
    stream = open_stream(client, ORDERS, service, delta)
    first = await subscribe_both(stream, pilot)
    assert_fresh_certificate(first, ORDERS, pilot)

    if isinstance(stream, DeltaStream):
        # Re-subscribing is answered even if unchanged: with the same certificate.
        await stream.subscribe(SECRET, [WORKLOAD])
        assert workload_in(await stream.ack_until(SECRET, [WORKLOAD], WAIT)) == first
    else:
        # The same list again changes nothing and is owed nothing.
        await stream.subscribe(SECRET, stream.names[SECRET])
        await assert_nothing_pending(stream)
    # Another stream of the same proxy (the other RPC, the other variant) gets it too.
    other_service = "sds" if service == "ads" else "ads"
    other = open_stream(client, ORDERS, other_service, not delta)
    await ask(other, [WORKLOAD])
    assert workload_in(await other.ack_until(SECRET, [WORKLOAD], WAIT)) == first

    assert served_workload(secrets_of(pilot), ORDERS) == first
    stats = secrets_of(pilot).stats
    assert (stats.minted, stats.rotated, stats.dropped) == (1, 0, 0)


@pytest.mark.parametrize(("service", "delta"), VARIANTS, ids=VARIANT_IDS)
async def test_unsubscribe_drops_and_resubscribe_mints_a_new_key(
    pilot: RunningPilot, client: XdsClient, service: str, delta: bool
) -> None:
    stream = open_stream(client, ORDERS, service, delta)
    first = await subscribe_both(stream, pilot)

    # Unsubscribe `default` alone (SotW: the list without it); ROOTCA stays.
    await stream.unsubscribe(SECRET, [WORKLOAD])
    await wait_dropped(pilot, ORDERS, 1)
    await assert_nothing_pending(stream)

    await ask(stream, [WORKLOAD])
    second = workload_in(await stream.ack_until(SECRET, [WORKLOAD], WAIT))

    assert_fresh_certificate(second, ORDERS, pilot)
    assert second.serial != first.serial
    assert second.key_id != first.key_id
    assert second.public_key_id != first.public_key_id
    stats = secrets_of(pilot).stats
    assert (stats.minted, stats.rotated, stats.dropped) == (2, 0, 1)


@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_empty_list_unsubscribes(pilot: RunningPilot, client: XdsClient, delta: bool) -> None:
    """SotW: an empty `resource_names` after names is "nothing"; delta: unsubscribe all."""
    stream = open_stream(client, ORDERS, "sds", delta)
    await subscribe_both(stream, pilot)
    await stream.unsubscribe(SECRET, [WORKLOAD, ROOT])
    await wait_dropped(pilot, ORDERS, 1)
    await ask(stream, [ROOT])
    answer = await stream.ack_until(SECRET, [ROOT], WAIT)
    assert (answer.responses, answer.names, answer.removed) == (1, [ROOT], []), answer
    assert secrets_of(pilot).stats.minted == 1


async def test_stream_end_drops_only_when_the_last_stream_goes(
    pilot: RunningPilot, client: XdsClient
) -> None:
    """Envoy holds `default` on its ADS stream and on an SDS stream at once."""
    ads = client.delta_ads(ORDERS.node())
    sds = client.sds(ORDERS.node())
    first = await subscribe_both(ads, pilot)
    await sds.subscribe(SECRET, [WORKLOAD])
    assert workload_in(await sds.ack_until(SECRET, [WORKLOAD], WAIT)) == first
    discovery = pilot.discovery
    streams = len(discovery.connections)

    await ads.close()
    await wait_until(
        lambda: len(discovery.connections),
        WAIT,
        "pilot to see the ADS stream end",
        until=lambda n: n == streams - 1,
    )
    secrets = secrets_of(pilot)
    assert secrets.stats.dropped == 0
    assert served_workload(secrets, ORDERS) == first
    await assert_nothing_pending(sds)

    await sds.close()
    await wait_dropped(pilot, ORDERS, 1)

    # A new stream of the same proxy starts from nothing: a new key.
    again = client.ads(ORDERS.node())
    second = await subscribe_both(again, pilot)
    assert_fresh_certificate(second, ORDERS, pilot)
    assert (second.serial, second.key_id) != (first.serial, first.key_id)
    assert secrets.stats.minted == 2


async def test_proxies_of_one_service_account_never_share_a_key(
    pilot: RunningPilot, client: XdsClient
) -> None:
    proxies = [Proxy.sidecar(f"orders-{i}", "shop", "orders") for i in range(4)]
    streams = [
        open_stream(client, proxy, service, delta)
        for proxy, (service, delta) in zip(proxies, VARIANTS, strict=True)
    ]
    certs = await asyncio.gather(*(subscribe_both(stream, pilot) for stream in streams))

    for cert, proxy in zip(certs, proxies, strict=True):
        assert_fresh_certificate(cert, proxy, pilot)
    assert len({cert.key_id for cert in certs}) == len(proxies)
    assert len({cert.public_key_id for cert in certs}) == len(proxies)
    assert len({cert.serial for cert in certs}) == len(proxies)

    # Dropping one proxy's certificate leaves the others as they were.
    await streams[0].close()
    await wait_dropped(pilot, proxies[0], 1)
    secrets = secrets_of(pilot)
    for cert, proxy in zip(certs[1:], proxies[1:], strict=True):
        assert served_workload(secrets, proxy) == cert
    assert secrets.stats.minted == len(proxies)


async def test_rsa_key_type(tmp_path: Path) -> None:
    rsa = {"sds": SdsSettings(key_type=KeyType.RSA)}
    async with (
        running_pilot(tmp_path, simple_mesh(MESH_SERVICES), security=rsa) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        cert = await subscribe_both(client.delta_ads(ORDERS.node()), pilot)
        assert_fresh_certificate(cert, ORDERS, pilot)
        assert cert.key_kind == "RSA 2048"
