"""State-of-the-world conformance (StreamAggregatedResources, StreamClusters, StreamEndpoints).

Checks, on the wire, the "State of the world" rules of the protocol checklist
(shared/xds-protocol.md) and the SotW side of "Both variants": ACK/NACK by nonce
and error_detail, stale nonces, wildcard CDS with the full set in every
response, named EDS, send-only-on-change, and EDS following every CDS push.

A test that asserts "nothing was sent" never sleeps: it provokes a second,
distinguishable response and asserts that this is the next one to arrive.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.protocol.registry import CONFIG_MAP, GHOST, A, B, C, D, Registry
from tests.support.mesh import cluster_name
from tests.support.pilot import RunningPilot
from tests.support.xds_client import (
    CLUSTER,
    ENDPOINT,
    DiscoveryResponse,
    SotwStream,
    XdsClient,
    assignments,
    clusters,
    endpoint_ips,
    node,
    sotw_names,
)

Opener = Callable[[XdsClient], SotwStream]

CDS_OPENERS: dict[str, Opener] = {"ads": XdsClient.ads, "standalone": XdsClient.cds}
EDS_OPENERS: dict[str, Opener] = {"ads": XdsClient.ads, "standalone": XdsClient.eds}


async def started(xds: XdsClient, eds: list[str]) -> SotwStream:
    """An ADS stream as Envoy leaves it after startup: CDS wildcard, then EDS for `eds`
    (no EDS request if empty), every response ACKed."""
    ads = xds.ads()
    await ads.subscribe(CLUSTER)
    await ads.ack(await ads.expect(CLUSTER))
    if eds:
        await ads.subscribe(ENDPOINT, eds)
        await ads.ack(await ads.expect(ENDPOINT))
    return ads


async def expect_only(stream: SotwStream, type_url: str, names: set[str]) -> DiscoveryResponse:
    """The next response must be of this type and carry exactly these names; it is ACKed."""
    response = await stream.expect(type_url)
    assert set(sotw_names(response)) == names, f"expected exactly {sorted(names)}"
    await stream.ack(response)
    return response


# --------------------------------------------------------------------------- wildcard CDS


@pytest.mark.parametrize("names", [[], ["*"]], ids=["legacy-wildcard", "star"])
@pytest.mark.parametrize("opener", CDS_OPENERS.values(), ids=CDS_OPENERS.keys())
async def test_wildcard_cds_gets_every_cluster(
    xds: XdsClient, opener: Opener, names: list[str]
) -> None:
    stream = opener(xds)
    await stream.subscribe(CLUSTER, names)
    assert set(clusters(await stream.expect(CLUSTER))) == {A, B, C}


@pytest.mark.parametrize("opener", CDS_OPENERS.values(), ids=CDS_OPENERS.keys())
async def test_cds_push_carries_the_full_set_not_only_the_new_cluster(
    xds: XdsClient, registry: Registry, opener: Opener
) -> None:
    stream = opener(xds)
    await stream.subscribe(CLUSTER)
    await stream.ack(await stream.expect(CLUSTER))
    registry.endpoints["d"] = ["10.0.4.1"]
    await registry.write()
    assert set(clusters(await stream.expect(CLUSTER))) == {A, B, C, D}


@pytest.mark.parametrize("opener", CDS_OPENERS.values(), ids=CDS_OPENERS.keys())
async def test_deleted_service_is_missing_from_the_next_cds_response(
    xds: XdsClient, registry: Registry, opener: Opener
) -> None:
    stream = opener(xds)
    await stream.subscribe(CLUSTER, ["*"])
    await stream.ack(await stream.expect(CLUSTER))
    del registry.endpoints["b"]
    await registry.write()
    assert set(clusters(await stream.expect(CLUSTER))) == {A, C}


async def test_star_with_an_explicit_name_sends_that_cluster_once(xds: XdsClient) -> None:
    ads = xds.ads()
    await ads.subscribe(CLUSTER, ["*", A, A])
    response = await ads.expect(CLUSTER)
    assert sorted(sotw_names(response)) == sorted([A, B, C])


# --------------------------------------------------------------------------- ACK / NACK


async def test_ack_by_nonce_gets_no_response(xds: XdsClient, pilot: RunningPilot) -> None:
    ads = xds.ads()
    await ads.subscribe(CLUSTER)
    await ads.ack(await ads.expect(CLUSTER))
    await ads.subscribe(ENDPOINT, [A])
    # The CDS ACK was not answered: the next response is the EDS one.
    await expect_only(ads, ENDPOINT, {A})
    await ads.subscribe(ENDPOINT, [A, B])
    # Nor was the EDS ACK: the next EDS response is for the new name only.
    await expect_only(ads, ENDPOINT, {B})
    assert pilot.discovery.stats.nacks[CLUSTER] == 0
    assert pilot.discovery.stats.nacks[ENDPOINT] == 0


async def test_ack_is_matched_by_nonce_not_by_version(xds: XdsClient, pilot: RunningPilot) -> None:
    ads = xds.ads()
    await ads.subscribe(CLUSTER)
    response = await ads.expect(CLUSTER)
    # An ACK whose version_info is not the one sent: still an ACK (no error_detail).
    await ads.request(CLUSTER, version="some-older-version", nonce=response.nonce)
    await ads.subscribe(ENDPOINT, [A])
    await expect_only(ads, ENDPOINT, {A})
    assert pilot.discovery.stats.nacks[CLUSTER] == 0


async def test_nack_is_recorded_with_type_proxy_and_message(
    xds: XdsClient, pilot: RunningPilot, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = "sidecar~10.7.7.7~nacker-1.default~default.svc.cluster.local"
    ads = xds.ads(node(proxy))
    await ads.subscribe(CLUSTER)
    response = await ads.expect(CLUSTER)
    with caplog.at_level(logging.WARNING):
        # Sent without node (only the first message carries it).
        await ads.nack(response, "cds: duplicate cluster zebra-4711")
        await ads.subscribe(ENDPOINT, [A])
        await expect_only(ads, ENDPOINT, {A})
    assert pilot.discovery.stats.nacks[CLUSTER] == 1
    assert pilot.discovery.stats.nacks[ENDPOINT] == 0
    logged = [r.getMessage() for r in caplog.records if "zebra-4711" in r.getMessage()]
    assert logged, "the NACK's message was not recorded"
    assert any(proxy in line for line in logged), f"NACK record does not name the proxy: {logged}"


async def test_nack_is_detected_by_error_detail_even_with_the_sent_version(
    xds: XdsClient, pilot: RunningPilot
) -> None:
    ads = xds.ads()
    await ads.subscribe(CLUSTER)
    response = await ads.expect(CLUSTER)
    await ads.request(
        CLUSTER, version=response.version_info, nonce=response.nonce, error="bad cluster"
    )
    await ads.subscribe(ENDPOINT, [A])
    await expect_only(ads, ENDPOINT, {A})
    assert pilot.discovery.stats.nacks[CLUSTER] == 1


async def test_nacked_cds_version_is_not_resent(xds: XdsClient, registry: Registry) -> None:
    ads = xds.ads()
    await ads.subscribe(CLUSTER)
    rejected = await ads.expect(CLUSTER)
    await ads.nack(rejected)
    # Not answered by the same clusters again: the next response is the EDS one.
    await ads.subscribe(ENDPOINT, [A])
    await expect_only(ads, ENDPOINT, {A})
    registry.endpoints["d"] = ["10.0.4.1"]
    await registry.write()
    fixed = await ads.expect(CLUSTER)
    assert set(clusters(fixed)) == {A, B, C, D}
    assert fixed.version_info != rejected.version_info


async def test_nacked_eds_version_is_not_resent(xds: XdsClient) -> None:
    ads = await started(xds, [])
    await ads.subscribe(ENDPOINT, [A])
    await ads.nack(await ads.expect(ENDPOINT))
    await ads.subscribe(ENDPOINT, [A, B])
    await expect_only(ads, ENDPOINT, {B})


# --------------------------------------------------------------------------- stale nonces


async def stale_setup(xds: XdsClient, registry: Registry) -> tuple[SotwStream, str]:
    """An ADS stream subscribed to EDS [A] that has seen two EDS responses; the first nonce."""
    ads = await started(xds, [A])
    first_nonce = ads.nonces[ENDPOINT]
    registry.endpoints["a"] = ["10.0.1.9"]
    await registry.write()
    await expect_only(ads, ENDPOINT, {A})
    return ads, first_nonce


async def test_stale_nonce_with_unchanged_names_gets_no_response(
    xds: XdsClient, registry: Registry
) -> None:
    ads, stale = await stale_setup(xds, registry)
    await ads.request(ENDPOINT, [A], nonce=stale)
    await ads.subscribe(ENDPOINT, [A, B])
    await expect_only(ads, ENDPOINT, {B})


async def test_stale_nonce_still_adds_names(xds: XdsClient, registry: Registry) -> None:
    ads, stale = await stale_setup(xds, registry)
    ads.names[ENDPOINT] = [A, B]
    await ads.request(ENDPOINT, [A, B], nonce=stale)
    await expect_only(ads, ENDPOINT, {B})


async def test_stale_nonce_still_removes_names(xds: XdsClient, registry: Registry) -> None:
    ads, stale = await stale_setup(xds, registry)
    await ads.subscribe(ENDPOINT, [A, B])
    await expect_only(ads, ENDPOINT, {B})
    ads.names[ENDPOINT] = [B]
    await ads.request(ENDPOINT, [B], nonce=stale)
    registry.endpoints["a"] = ["10.0.1.10"]
    registry.endpoints["b"] = ["10.0.2.10"]
    await registry.write()
    await expect_only(ads, ENDPOINT, {B})


# --------------------------------------------------------------------------- named EDS


@pytest.mark.parametrize("opener", EDS_OPENERS.values(), ids=EDS_OPENERS.keys())
async def test_eds_sends_only_the_requested_names(
    xds: XdsClient, registry: Registry, opener: Opener
) -> None:
    stream = opener(xds)
    await stream.subscribe(ENDPOINT, [A, C])
    got = assignments(await expect_only(stream, ENDPOINT, {A, C}))
    assert {name: endpoint_ips(cla) for name, cla in got.items()} == {
        A: registry.ips(A),
        C: registry.ips(C),
    }


async def test_eds_name_requested_again_is_answered_even_if_unchanged(xds: XdsClient) -> None:
    ads = await started(xds, [A, B])
    await ads.subscribe(ENDPOINT, [A])
    await ads.subscribe(ENDPOINT, [A, B])
    await expect_only(ads, ENDPOINT, {B})


async def test_eds_missing_name_is_not_answered_and_is_pushed_when_it_appears(
    xds: XdsClient, registry: Registry
) -> None:
    ads = await started(xds, [])
    await ads.subscribe(ENDPOINT, [A, GHOST])
    await expect_only(ads, ENDPOINT, {A})
    await ads.subscribe(ENDPOINT, [A, GHOST, B])
    await expect_only(ads, ENDPOINT, {B})
    registry.endpoints["ghost"] = ["10.0.6.1"]
    await registry.write()
    # The new cluster comes first, then its assignment for the remembered name.
    await ads.ack(await ads.expect(CLUSTER))
    response = await ads.expect(ENDPOINT)
    assert GHOST in assignments(response)
    assert endpoint_ips(assignments(response)[GHOST]) == {"10.0.6.1"}


async def test_eds_empty_names_after_named_unsubscribes_from_all(
    xds: XdsClient, registry: Registry
) -> None:
    ads = await started(xds, [A, B])
    watcher = await started(xds, [A, D])
    await ads.subscribe(ENDPOINT, [])
    registry.endpoints["a"] = ["10.0.1.11"]
    registry.endpoints["d"] = ["10.0.4.1"]
    await registry.write()
    # Wait until the push went out (to another stream), then probe the first one.
    await watcher.ack(await watcher.expect(CLUSTER))
    assert set(assignments(await watcher.expect(ENDPOINT))) >= {A}
    await ads.ack(await ads.expect(CLUSTER))  # wildcard CDS still gets D
    await ads.subscribe(ENDPOINT, [B])
    await expect_only(ads, ENDPOINT, {B})


async def test_eds_never_sends_a_name_twice_in_one_response(xds: XdsClient) -> None:
    ads = await started(xds, [])
    await ads.subscribe(ENDPOINT, [A, B, A, B])
    response = await ads.expect(ENDPOINT)
    assert sorted(sotw_names(response)) == sorted([A, B])


# --------------------------------------------------------------------------- send on change


async def test_rewrite_with_identical_bytes_sends_nothing(
    xds: XdsClient, registry: Registry
) -> None:
    ads = await started(xds, [A, B])
    await registry.write()
    registry.endpoints["b"] = ["10.0.2.2"]
    await registry.write()
    got = assignments(await expect_only(ads, ENDPOINT, {B}))
    assert endpoint_ips(got[B]) == {"10.0.2.2"}


async def test_rewrite_with_equivalent_content_sends_nothing(
    xds: XdsClient, registry: Registry
) -> None:
    ads = await started(xds, [A, B])
    registry.reverse = True
    registry.ignored.append(CONFIG_MAP)
    await registry.write()
    registry.endpoints["b"] = ["10.0.2.2"]
    await registry.write()
    await expect_only(ads, ENDPOINT, {B})


async def test_change_that_leaves_every_resource_equal_sends_nothing(
    xds: XdsClient, registry: Registry
) -> None:
    ads = await started(xds, [A, B])
    registry.unready["a"] = ["10.0.1.99"]  # not ready: not in the assignment
    registry.udp.add("b")  # a UDP port: no cluster for it
    await registry.write()
    registry.endpoints["b"] = ["10.0.2.2"]
    await registry.write()
    got = assignments(await expect_only(ads, ENDPOINT, {B}))
    assert endpoint_ips(got[B]) == {"10.0.2.2"}


async def test_endpoint_change_sends_eds_for_that_cluster_and_no_cds(
    xds: XdsClient, registry: Registry
) -> None:
    ads = await started(xds, [A, B])
    registry.endpoints["a"] = ["10.0.1.7", "10.0.1.8"]
    await registry.write()
    got = assignments(await expect_only(ads, ENDPOINT, {A}))
    assert endpoint_ips(got[A]) == {"10.0.1.7", "10.0.1.8"}
    registry.endpoints["d"] = ["10.0.4.1"]
    await registry.write()
    assert set(clusters(await ads.expect(CLUSTER))) == {A, B, C, D}


@pytest.mark.parametrize("gone", [[], None], ids=["empty-slice", "no-slice"])
async def test_endpoints_dropping_to_zero_send_an_empty_assignment(
    xds: XdsClient, registry: Registry, gone: list[str] | None
) -> None:
    ads = await started(xds, [A])
    registry.endpoints["a"] = gone
    await registry.write()
    got = assignments(await expect_only(ads, ENDPOINT, {A}))
    assert endpoint_ips(got[A]) == set()


async def test_endpoint_change_reaches_only_streams_subscribed_to_it(
    xds: XdsClient, registry: Registry
) -> None:
    on_a = await started(xds, [A])
    on_b = await started(xds, [B])
    registry.endpoints["a"] = ["10.0.1.12"]
    await registry.write()
    await expect_only(on_a, ENDPOINT, {A})
    registry.endpoints["b"] = ["10.0.2.12"]
    await registry.write()
    await expect_only(on_b, ENDPOINT, {B})


# --------------------------------------------------------------------------- CDS then EDS


async def test_cds_push_is_followed_by_eds_for_the_clusters_it_carried(
    xds: XdsClient, registry: Registry
) -> None:
    ads = await started(xds, [A, B])
    registry.grpc.add("a")  # changes cluster A, not its endpoints
    await registry.write()
    response = await ads.expect(CLUSTER)
    pushed = clusters(response)
    assert set(pushed) == {A, B, C}
    assert pushed[A].typed_extension_protocol_options, "cluster A did not change"
    await ads.ack(response)
    # Envoy keeps the re-sent clusters warming until their assignments arrive.
    followed = assignments(await ads.expect(ENDPOINT))
    assert set(followed) == {A, B}
    assert endpoint_ips(followed[A]) == registry.ips(A)


async def test_cds_push_with_a_new_cluster_then_its_eds_request_is_answered(
    xds: XdsClient, registry: Registry
) -> None:
    ads = await started(xds, [A, B, C])
    registry.endpoints["d"] = ["10.0.4.1"]
    await registry.write()
    await ads.ack(await ads.expect(CLUSTER))
    await ads.ack(await ads.expect(ENDPOINT))
    await ads.subscribe(ENDPOINT, [A, B, C, D])
    await expect_only(ads, ENDPOINT, {D})


async def test_standalone_cds_push_is_followed_by_eds_on_the_eds_stream(
    xds: XdsClient, registry: Registry
) -> None:
    envoy = node("sidecar~10.8.8.8~split.default~default.svc.cluster.local")
    cds, eds = xds.cds(envoy), xds.eds(envoy)
    await cds.subscribe(CLUSTER)
    await cds.ack(await cds.expect(CLUSTER))
    await eds.subscribe(ENDPOINT, [A, B])
    await expect_only(eds, ENDPOINT, {A, B})
    registry.grpc.add("a")
    await registry.write()
    await cds.ack(await cds.expect(CLUSTER))
    followed = assignments(await eds.expect(ENDPOINT))
    assert A in followed


async def test_pushes_are_ordered_cds_before_eds(xds: XdsClient, registry: Registry) -> None:
    ads = await started(xds, [A, B])
    registry.endpoints["d"] = ["10.0.4.1"]
    registry.endpoints["a"] = ["10.0.1.13"]
    await registry.write()
    assert set(clusters(await ads.expect(CLUSTER))) == {A, B, C, D}
    assert A in assignments(await ads.expect(ENDPOINT))


# --------------------------------------------------------------------------- model check

POOL = [A, B, GHOST]
PROBE = C

# A step is a new resource_names list, or the name of a service whose endpoints change.
STEPS = st.lists(
    st.one_of(st.lists(st.sampled_from(POOL), max_size=4), st.sampled_from(["a", "b"])),
    min_size=1,
    max_size=8,
)


async def change_endpoints(registry: Registry, watcher: SotwStream, service: str) -> None:
    """Give a service a new endpoint; returns once the push reached a watching stream."""
    registry.renumber(service)
    await registry.write()
    response = await watcher.expect(ENDPOINT)
    await watcher.ack(response)
    assert cluster_name(service) in assignments(response)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=STEPS)
async def test_random_eds_subscriptions_and_changes_keep_the_client_view_exact(
    xds: XdsClient, registry: Registry, steps: list[list[str] | str]
) -> None:
    """After any sequence of resource_names lists and endpoint changes, the client
    holds exactly the current assignment of every subscribed name that exists,
    and nothing is sent for names that were not subscribed."""
    watcher = await started(xds, [A, B])
    ads = xds.ads()
    await ads.subscribe(ENDPOINT, [PROBE])
    await expect_only(ads, ENDPOINT, {PROBE})
    names: list[str] = []
    view: dict[str, set[str]] = {}
    try:
        for step in steps:
            if isinstance(step, str):
                await change_endpoints(registry, watcher, step)
            else:
                names = step
            await ads.subscribe(ENDPOINT, names)
            # Probe: re-adding PROBE must be answered; what the step owed comes first or with it.
            await ads.subscribe(ENDPOINT, [*names, PROBE])
            while True:
                response = await ads.expect(ENDPOINT)
                got = assignments(response)
                assert set(got) <= {*names, PROBE}, f"unrequested names in {sorted(got)}"
                view.update({name: endpoint_ips(cla) for name, cla in got.items()})
                if PROBE in got:
                    break
            view = {name: ips for name, ips in view.items() if name in names}
            expected = {n: registry.ips(n) for n in names if registry.ips(n) is not None}
            assert view == expected
    finally:
        await ads.close()
        await watcher.close()
