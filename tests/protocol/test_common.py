"""Rules shared by both variants, and the services around the streams.

Covers the checklist's "Both variants" section where it is not specific to one
variant: bad type URLs, `node` on the first message only, nonces scoped to one
stream, versions per type; and what pilot serves besides streams: Fetch*,
gRPC health, server reflection, the standalone CDS/EDS services, and the EDS
config source written into clusters for each kind of client.
"""

from __future__ import annotations

import logging

import grpc
import pytest
from envoy.config.core.v3 import config_source_pb2
from grpc_health.v1 import health_pb2

from tests.protocol.registry import GHOST, A, B, C, Registry
from tests.support.xds_client import (
    ADS_DELTA,
    ADS_SERVICE,
    ADS_SOTW,
    CDS_SERVICE,
    CDS_SOTW,
    CLUSTER,
    EDS_SERVICE,
    ENDPOINT,
    Closed,
    Cluster,
    DeltaRequest,
    DiscoveryRequest,
    DiscoveryResponse,
    XdsClient,
    assignments,
    clusters,
    delta_resources,
    endpoint_ips,
    first_reply,
    node,
    sotw_names,
)

HEALTH_SERVICE = "grpc.health.v1.Health"
REFLECTION_SERVICE = "grpc.reflection.v1alpha.ServerReflection"
SERVING = health_pb2.HealthCheckResponse.SERVING

BAD_TYPE_URLS = {
    "empty": "",
    # A real xDS type pilot does not serve (listeners and routes it does).
    "unserved": "type.googleapis.com/envoy.config.route.v3.ScopedRouteConfiguration",
    "unknown": "type.googleapis.com/example.v1.Nothing",
}


# --------------------------------------------------------------------------- bad type URLs


async def bad_then_good(xds: XdsClient, method: str, bad_type: str) -> Closed | set[str]:
    """On a fresh stream, a request of `bad_type`, then a valid CDS wildcard request.

    Returns how the server ended the stream, or the clusters the valid request got.
    """
    bad: DiscoveryRequest | DeltaRequest
    good: DiscoveryRequest | DeltaRequest
    if method == ADS_DELTA:
        bad = DeltaRequest(type_url=bad_type, resource_names_subscribe=[A], node=node())
        good = DeltaRequest(type_url=CLUSTER, resource_names_subscribe=["*"])
    else:
        bad = DiscoveryRequest(type_url=bad_type, resource_names=[A], node=node())
        good = DiscoveryRequest(type_url=CLUSTER)
    reply = await first_reply(xds.target, method, [bad, good])
    if isinstance(reply, Closed):
        return reply
    assert reply.type_url == CLUSTER, f"answered the {bad_type!r} request"
    if isinstance(reply, DiscoveryResponse):
        return set(clusters(reply))
    return set(delta_resources(reply))


@pytest.mark.parametrize("bad_type", BAD_TYPE_URLS.values(), ids=BAD_TYPE_URLS.keys())
@pytest.mark.parametrize("delta", [False, True], ids=["sotw", "delta"])
async def test_bad_type_url_is_rejected_or_ignored_never_fatal(
    xds: XdsClient, caplog: pytest.LogCaptureFixture, delta: bool, bad_type: str
) -> None:
    with caplog.at_level(logging.INFO):
        outcome = await bad_then_good(xds, ADS_DELTA if delta else ADS_SOTW, bad_type)
    if isinstance(outcome, Closed):
        assert outcome.code == grpc.StatusCode.INVALID_ARGUMENT, outcome
    else:
        assert outcome == {A, B, C}
        assert any(
            r.levelno >= logging.WARNING and (bad_type or "type_url") in r.getMessage()
            for r in caplog.records
        ), "the ignored request was not logged"
    # The server is still up and serving.
    fresh = xds.ads()
    await fresh.subscribe(CLUSTER)
    assert set(clusters(await fresh.expect(CLUSTER))) == {A, B, C}
    assert await xds.health() == SERVING


async def test_other_type_on_a_standalone_service_is_rejected_or_ignored(
    xds: XdsClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        outcome = await bad_then_good(xds, CDS_SOTW, ENDPOINT)
    if isinstance(outcome, Closed):
        assert outcome.code == grpc.StatusCode.INVALID_ARGUMENT, outcome
    else:
        assert outcome == {A, B, C}
        assert any(r.levelno >= logging.WARNING for r in caplog.records)


# --------------------------------------------------------------------------- node, nonces, versions


async def test_node_sent_only_on_the_first_message_identifies_the_whole_stream(
    xds: XdsClient, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = "sidecar~10.5.5.5~first-only.default~default.svc.cluster.local"
    ads = xds.ads(node(proxy))
    await ads.subscribe(CLUSTER)
    await ads.ack(await ads.expect(CLUSTER))
    assert ads.sent[0].node.id == proxy
    await ads.subscribe(ENDPOINT, [A])
    response = await ads.expect(ENDPOINT)
    with caplog.at_level(logging.WARNING):
        await ads.nack(response, "marker-5150")
        await ads.subscribe(ENDPOINT, [A, B])
        assert set(sotw_names(await ads.expect(ENDPOINT))) == {B}
    assert all(not request.HasField("node") for request in ads.sent[1:])
    records = [r.getMessage() for r in caplog.records if "marker-5150" in r.getMessage()]
    assert records and all(proxy in line for line in records), records


async def test_nonces_are_unique_within_a_stream(xds: XdsClient, registry: Registry) -> None:
    ads = xds.ads()
    await ads.subscribe(CLUSTER)
    await ads.ack(await ads.expect(CLUSTER))
    await ads.subscribe(ENDPOINT, [A])
    await ads.ack(await ads.expect(ENDPOINT))
    await ads.subscribe(ENDPOINT, [A, B])
    await ads.ack(await ads.expect(ENDPOINT))
    registry.endpoints["d"] = ["10.0.4.1"]
    await registry.write()
    await ads.ack(await ads.expect(CLUSTER))
    await ads.ack(await ads.expect(ENDPOINT))
    nonces = [r.nonce for r in ads.received]
    assert len(set(nonces)) == len(nonces), nonces


async def test_nonce_from_an_earlier_stream_is_not_an_ack_on_a_new_one(xds: XdsClient) -> None:
    old = xds.ads()
    await old.subscribe(CLUSTER)
    cds = await old.expect(CLUSTER)
    await old.ack(cds)
    await old.subscribe(ENDPOINT, [A])
    eds = await old.expect(ENDPOINT)
    await old.close()
    # Reconnect as Envoy does, carrying what it had: each request must still be answered.
    new = xds.ads()
    await new.request(CLUSTER, version=cds.version_info, nonce=cds.nonce)
    assert set(clusters(await new.expect(CLUSTER))) == {A, B, C}
    await new.request(ENDPOINT, [A], version=eds.version_info, nonce=eds.nonce)
    assert set(sotw_names(await new.expect(ENDPOINT))) == {A}


async def test_delta_nonce_from_an_earlier_stream_is_not_an_ack_on_a_new_one(
    xds: XdsClient,
) -> None:
    old = xds.delta_ads()
    await old.subscribe(ENDPOINT, [A])
    first = await old.expect(ENDPOINT)
    await old.close()
    new = xds.delta_ads()
    await new.request(ENDPOINT, subscribe=[A], nonce=first.nonce)
    assert set(delta_resources(await new.expect(ENDPOINT))) == {A}


async def test_cds_version_is_per_type_not_moved_by_endpoint_changes(
    xds: XdsClient, registry: Registry
) -> None:
    first = xds.ads()
    await first.subscribe(CLUSTER)
    before = await first.expect(CLUSTER)
    await first.ack(before)
    await first.subscribe(ENDPOINT, [A])
    eds_before = await first.expect(ENDPOINT)
    await first.ack(eds_before)
    registry.endpoints["a"] = ["10.0.1.40"]
    await registry.write()
    eds_after = await first.expect(ENDPOINT)
    assert eds_after.version_info != eds_before.version_info
    # Same clusters, so the same CDS version, on any stream.
    second = xds.ads()
    await second.subscribe(CLUSTER)
    assert (await second.expect(CLUSTER)).version_info == before.version_info


# --------------------------------------------------------------------------- Fetch*


async def test_fetch_clusters_returns_every_cluster(xds: XdsClient) -> None:
    response = await xds.fetch_clusters()
    assert response.type_url == CLUSTER
    assert response.version_info
    assert set(clusters(response)) == {A, B, C}


async def test_fetch_endpoints_returns_the_requested_assignments(
    xds: XdsClient, registry: Registry
) -> None:
    response = await xds.fetch_endpoints([A, GHOST])
    assert response.type_url == ENDPOINT
    got = assignments(response)
    assert set(got) == {A}
    assert endpoint_ips(got[A]) == registry.ips(A)


async def test_fetch_endpoints_for_a_missing_name_is_empty(xds: XdsClient) -> None:
    response = await xds.fetch_endpoints([GHOST])
    assert response.type_url == ENDPOINT
    assert list(response.resources) == []


async def test_fetch_sees_registry_changes(xds: XdsClient, registry: Registry) -> None:
    del registry.endpoints["c"]
    await registry.write()
    watcher = xds.ads()
    await watcher.subscribe(CLUSTER)
    # Once a stream has seen the new state (maybe after the old one), so does Fetch.
    seen = set(clusters(await watcher.expect(CLUSTER)))
    if seen != {A, B}:
        seen = set(clusters(await watcher.expect(CLUSTER)))
    assert seen == {A, B}
    assert set(clusters(await xds.fetch_clusters())) == {A, B}


# --------------------------------------------------------------------------- health, reflection


@pytest.mark.parametrize("service", ["", ADS_SERVICE, CDS_SERVICE, EDS_SERVICE])
async def test_health_reports_serving(xds: XdsClient, service: str) -> None:
    assert await xds.health(service) == SERVING


async def test_reflection_lists_the_services(xds: XdsClient) -> None:
    listed = await xds.reflected_services()
    expected = {ADS_SERVICE, CDS_SERVICE, EDS_SERVICE, HEALTH_SERVICE, REFLECTION_SERVICE}
    assert expected <= listed, f"missing: {sorted(expected - listed)}"


# --------------------------------------------------------------------------- standalone services


async def test_standalone_cds_accepts_an_implicit_type_url(xds: XdsClient) -> None:
    cds = xds.cds()
    await cds.send(DiscoveryRequest())
    assert set(clusters(await cds.expect(CLUSTER))) == {A, B, C}


async def test_standalone_eds_accepts_an_implicit_type_url(xds: XdsClient) -> None:
    eds = xds.eds()
    await eds.send(DiscoveryRequest(resource_names=[B]))
    assert set(assignments(await eds.expect(ENDPOINT))) == {B}


async def test_standalone_delta_eds_serves_assignments(xds: XdsClient, registry: Registry) -> None:
    eds = xds.delta_eds()
    await eds.subscribe(ENDPOINT, [C])
    got = delta_resources(await eds.expect(ENDPOINT))
    assert set(got) == {C}
    assert endpoint_ips(got[C].message) == registry.ips(C)


# --------------------------------------------------------------------------- EDS config source


GRPC = config_source_pb2.ApiConfigSource.GRPC
DELTA_GRPC = config_source_pb2.ApiConfigSource.DELTA_GRPC


async def clusters_via(xds: XdsClient, kind: str) -> list[Cluster]:
    """Every cluster as one kind of client receives it."""
    if kind in ("ads", "cds"):
        sotw = xds.ads() if kind == "ads" else xds.cds()
        await sotw.subscribe(CLUSTER)
        return list(clusters(await sotw.expect(CLUSTER)).values())
    delta = xds.delta_ads() if kind == "delta-ads" else xds.delta_cds()
    await delta.subscribe(CLUSTER, ["*"])
    return [held.message for held in delta_resources(await delta.expect(CLUSTER)).values()]


@pytest.mark.parametrize("kind", ["ads", "delta-ads"])
async def test_clusters_over_ads_take_endpoints_from_ads(xds: XdsClient, kind: str) -> None:
    for cluster in await clusters_via(xds, kind):
        eds_config = cluster.eds_cluster_config.eds_config
        assert eds_config.WhichOneof("config_source_specifier") == "ads", cluster
        assert eds_config.resource_api_version == config_source_pb2.V3


@pytest.mark.parametrize(("kind", "api_type"), [("cds", GRPC), ("delta-cds", DELTA_GRPC)])
async def test_clusters_over_standalone_cds_take_endpoints_from_xds_grpc(
    xds: XdsClient, kind: str, api_type: int
) -> None:
    for cluster in await clusters_via(xds, kind):
        eds_config = cluster.eds_cluster_config.eds_config
        assert eds_config.WhichOneof("config_source_specifier") == "api_config_source"
        api = eds_config.api_config_source
        assert api.api_type == api_type
        assert api.transport_api_version == config_source_pb2.V3
        assert [s.envoy_grpc.cluster_name for s in api.grpc_services] == ["xds-grpc"]
