"""pilot's responses as gRPC delivers them, read by envoy-data-plane as well as by protobuf.

A running pilot (registry file, its own CA) serves recorded streams: each keeps
the raw bytes of every response before decoding it, so the bytes checked are the
ones on the wire. SotW and delta ADS fetch clusters, assignments (one with no
ready endpoint, one with no EndpointSlice at all, one that never exists) and
the secrets `default` (minted for the stream's proxy) and `ROOTCA`; the
standalone SotW and delta CDS streams fetch the other two cluster flavors; then
a service goes away (a full CDS set without it, delta removals), and the unary
Fetch calls answer, once with nothing. Every response must decode the same in
both libraries and carry what the registry and the CA hold
(tests/support/independent_decoding.py). Generated registries are covered in
process by tests/unit/test_independent_decoding.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pilot.xds.flavor import Flavor
from pilot.xds.proxy import ProxyKey
from tests.protocol.registry import GHOST, A, B, C, Registry
from tests.support.independent_decoding import (
    Frame,
    SecretFacts,
    digest,
    expected_cluster,
    read_response,
)
from tests.support.mesh import cluster_name
from tests.support.pilot import RunningPilot
from tests.support.xds_client import (
    ADS_DELTA,
    ADS_SOTW,
    CDS_SERVICE,
    CDS_SOTW,
    CLUSTER,
    DEFAULT_TIMEOUT,
    EDS_SERVICE,
    ENDPOINT,
    SECRET,
    Arrived,
    DeltaResponse,
    DeltaStream,
    DiscoveryRequest,
    DiscoveryResponse,
    SotwStream,
    XdsClient,
    node,
)

PROXY = "sidecar~10.3.3.3~reader-1.default~default.svc.cluster.local"
ACCOUNT = {"NAMESPACE": "default", "SERVICE_ACCOUNT": "reader"}
IDENTITY = "spiffe://cluster.local/ns/default/sa/reader"
NO_READY, NO_SLICE = cluster_name("e"), cluster_name("f")
CLUSTERS = [A, B, C, NO_READY, NO_SLICE]
SECRETS = ["default", "ROOTCA"]
CDS_DELTA = f"/{CDS_SERVICE}/DeltaClusters"
FETCH_CLUSTERS = f"/{CDS_SERVICE}/FetchClusters"
FETCH_ENDPOINTS = f"/{EDS_SERVICE}/FetchEndpoints"


@dataclass
class Recorded:
    """What one call received: the raw bytes of each response, as gRPC delivered them."""

    label: str
    flavor: Flavor
    delta: bool
    wire: list[bytes] = field(default_factory=list, repr=False)

    def keep(self, data: bytes) -> DiscoveryResponse | DeltaResponse:
        """The call's response deserializer: keep the bytes, then decode as the client does."""
        self.wire.append(data)
        return (DeltaResponse if self.delta else DiscoveryResponse).FromString(data)


def open_recorded(xds: XdsClient, method: str, recorded: Recorded) -> SotwStream | DeltaStream:
    """A test-client stream on `method` whose responses are also kept as bytes."""
    rpc = xds.channel.stream_stream(
        method,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=recorded.keep,
    )
    stream_class = DeltaStream if recorded.delta else SotwStream
    stream = stream_class(rpc(metadata=xds.metadata), recorded.label, node(PROXY, ACCOUNT))
    xds.streams.append(stream)
    return stream


async def fetch(xds: XdsClient, method: str, type_url: str, names: Iterable[str]) -> bytes:
    """A unary Fetch*, answered as raw bytes."""
    rpc = xds.channel.unary_unary(
        method,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=lambda data: data,
    )
    request = DiscoveryRequest(type_url=type_url, resource_names=list(names), node=node())
    reply: bytes = await rpc(request, timeout=DEFAULT_TIMEOUT, metadata=xds.metadata)
    return reply


async def ack_until_removed(stream: SotwStream | DeltaStream, type_url: str, name: str) -> None:
    """Read and ACK responses until a delta response removes `name` of `type_url`."""
    arrived = Arrived(type_url)
    while name not in arrived.removed:
        response = await stream.next_response()
        arrived.record(response)
        await stream.ack(response)


@dataclass(frozen=True)
class Expected:
    """What each resource must read as: from the registry file and pilot's CA."""

    hosts: dict[str, dict[tuple[str, int], tuple[str, str]]]
    secrets: dict[str, SecretFacts]

    def check(self, frame: Frame, flavor: Flavor) -> None:
        for name, summary in frame.summaries().items():
            if frame.type_url == CLUSTER:
                assert summary == expected_cluster(name, flavor.value, http2=name == C)
            elif frame.type_url == ENDPOINT:
                assert summary == self.hosts[name], f"the endpoints of {name}"
            else:
                assert summary == self.secrets[name]


def expected(registry: Registry, pilot: RunningPilot) -> Expected:
    hosts = {
        name: {(ip, 8080): ("HEALTHY", "") for ip in registry.ips(name) or ()} for name in CLUSTERS
    }
    security = pilot.discovery.security
    assert security is not None
    certificate = security.secrets.current(ProxyKey(PROXY, IDENTITY))
    assert certificate is not None, "the proxy's certificate, served a moment ago"
    workload = SecretFacts("default", digest(certificate.chain_pem), digest(certificate.key_pem))
    root = SecretFacts("ROOTCA", trusted_ca_sha256=digest(security.secrets.root_pem().encode()))
    return Expected(hosts, {"default": workload, "ROOTCA": root})


async def test_responses_on_the_wire_read_the_same_in_envoy_data_plane(
    xds: XdsClient, registry: Registry, pilot: RunningPilot
) -> None:
    registry.endpoints |= {"e": [], "f": None}
    registry.unready = {"e": ["10.0.5.1"]}
    registry.grpc = {"c"}
    await registry.write()
    # Read once pilot has built this registry, so that every response reflects it.
    watcher = xds.ads()
    await watcher.subscribe(CLUSTER)
    await watcher.ack_until(CLUSTER, CLUSTERS)
    ads = Recorded("ads", Flavor.ADS, delta=False)
    delta_ads = Recorded("delta-ads", Flavor.ADS, delta=True)
    cds = Recorded("cds", Flavor.GRPC, delta=False)
    delta_cds = Recorded("delta-cds", Flavor.DELTA_GRPC, delta=True)
    sotw, delta = open_recorded(xds, ADS_SOTW, ads), open_recorded(xds, ADS_DELTA, delta_ads)
    for stream in (sotw, delta):
        await stream.subscribe(CLUSTER)
        await stream.ack_until(CLUSTER, CLUSTERS)
        await stream.subscribe(ENDPOINT, [*CLUSTERS, GHOST])
        await stream.ack_until(ENDPOINT, CLUSTERS)
        await stream.subscribe(SECRET, SECRETS)
        await stream.ack_until(SECRET, SECRETS)
    for recorded, method in ((cds, CDS_SOTW), (delta_cds, CDS_DELTA)):
        standalone = open_recorded(xds, method, recorded)
        await standalone.subscribe(CLUSTER)
        await standalone.ack_until(CLUSTER, CLUSTERS)
    want = expected(registry, pilot)

    del registry.endpoints["b"]
    await registry.write()
    await sotw.ack_until(CLUSTER, [A])
    await ack_until_removed(delta, CLUSTER, B)
    await ack_until_removed(delta, ENDPOINT, B)
    fetched = Recorded("fetch", Flavor.GRPC, delta=False)
    fetched.wire += [
        await fetch(xds, FETCH_CLUSTERS, CLUSTER, []),
        await fetch(xds, FETCH_ENDPOINTS, ENDPOINT, [A, NO_READY]),
        await fetch(xds, FETCH_ENDPOINTS, ENDPOINT, [GHOST]),
    ]

    seen: set[tuple[str, str]] = set()
    removed: dict[str, set[str]] = {}
    for recorded in (ads, delta_ads, cds, delta_cds, fetched):
        for wire in recorded.wire:
            frame = read_response(wire, delta=recorded.delta)
            want.check(frame, recorded.flavor)
            kind = f"{'delta' if recorded.delta else 'sotw'} {frame.type_url.rsplit('.', 1)[-1]}"
            seen |= {(kind, name) for name in frame.resources}
            removed.setdefault(kind, set()).update(frame.removed)
    for kind in ("sotw", "delta"):
        assert {n for k, n in seen if k == f"{kind} ClusterLoadAssignment"} >= {NO_READY, NO_SLICE}
        assert {n for k, n in seen if k == f"{kind} Secret"} == set(SECRETS)
    assert removed["delta Cluster"] == {B}
    assert removed["delta ClusterLoadAssignment"] == {GHOST, B}
    empty = read_response(fetched.wire[-1], delta=False)
    assert (empty.type_url, empty.resources) == (ENDPOINT, {}), "a Fetch for nothing that exists"
