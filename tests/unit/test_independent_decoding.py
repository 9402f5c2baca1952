"""Every kind of response pilot writes, for generated registries, read by envoy-data-plane too.

pilot assembles its responses by hand from pre-encoded fragments
(pilot/xds/resource.py; ClusterLoadAssignments in pilot/builders/eds.py).
Here pilot's own code makes them: the endpoint index and its updater, the
CDS/EDS generator, the SDS generator on the real secret manager and CA, the
cache, the push pipeline, the SotW and delta protocol machines, and
`server.convert.encode`, whose bytes are what a stream hands gRPC. The streams:
SotW and delta ADS (clusters, assignments by name, `default` and `ROOTCA`) and
the standalone SotW and delta CDS services (the other two cluster flavors).
Hypothesis makes the registry before and after a change (services, ports,
endpoints with addresses, target ports, conditions and zones), so responses
carry new, changed, empty and removed resources.

Each response goes through tests/support/independent_decoding.py: protobuf and
envoy-data-plane must read the same thing, and what envoy-data-plane reads must
be what pilot meant to write (the protocol response it encoded) and what the
test fed pilot (the registry, the certificate the secret manager holds).
tests/protocol/test_independent_decoding.py does the same over real gRPC.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pilot.builders.settings import BuildSettings
from pilot.generators.cds import ClusterGenerator
from pilot.generators.eds import EndpointGenerator
from pilot.generators.sds import ROOT_SECRET, WORKLOAD_SECRET, SecretGenerator
from pilot.protocol import DeltaStream, SotwStream
from pilot.protocol.kind import StreamKind
from pilot.protocol.messages import DeltaRequest, DeltaResponse, SotwRequest, SotwResponse
from pilot.push.pipeline import Pipeline
from pilot.push.request import RequestSink
from pilot.registry.index import EndpointIndex
from pilot.registry.model import (
    Endpoint,
    EndpointGroup,
    EndpointPort,
    EndpointSet,
    EndpointSetKey,
    Service,
    ServiceKey,
    ServicePort,
)
from pilot.registry.updater import IndexUpdater
from pilot.security.ca import CaSettings, CertificateAuthority
from pilot.security.ca_client import LocalCa
from pilot.security.secrets import SdsSettings, SecretManager
from pilot.server import convert
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.flavor import Flavor
from pilot.xds.interception import Interception
from pilot.xds.locality import NOWHERE, Locality
from pilot.xds.proxy import ProxyKey
from tests.support.envoy_process import wait_until
from tests.support.independent_decoding import (
    ClusterFacts,
    Frame,
    SecretFacts,
    digest,
    expected_cluster,
    read_response,
)
from tests.support.mesh import cluster_name

CDS, EDS, SDS = types.CLUSTER, types.ENDPOINT, types.SECRET
XDS_CLUSTER = BuildSettings().xds_cluster_name
GHOST = cluster_name("ghost", 1)  # asked for, never there: delta removes it at once
STREAMS = {
    "ads": StreamKind(False, None, Flavor.ADS),
    "delta-ads": StreamKind(True, None, Flavor.ADS),
    "cds": StreamKind(False, CDS, Flavor.GRPC),
    "delta-cds": StreamKind(True, CDS, Flavor.DELTA_GRPC),
}
H2_PREFIXES = ("grpc", "http2", "h2c")  # Istio: these port names speak HTTP/2

# --------------------------------------------------------------------------- the registry


@dataclass(frozen=True)
class Workload:
    """A Service and its one EndpointSlice (None: it has none)."""

    service: Service
    endpoints: EndpointSet | None = None

    def clusters(self) -> dict[str, ServicePort]:
        """Cluster name -> Service port, for the ports that become clusters (TCP)."""
        key = self.service.key
        return {
            cluster_name(key.name, p.port, key.namespace): p
            for p in self.service.ports
            if p.protocol == "TCP"
        }

    def hosts(self, port: ServicePort) -> dict[tuple[str, int], tuple[str, str]]:
        """What the assignment of `port` must hold: ready endpoints HEALTHY, serving and
        terminating ones DRAINING, at the slice's number for the port's name."""
        found: dict[tuple[str, int], tuple[str, str]] = {}
        for group in self.endpoints.groups if self.endpoints else ():
            for number in (p.port for p in group.ports if p.name == port.name):
                for endpoint in group.endpoints:
                    if health := _health(endpoint):
                        found[(endpoint.addresses[0], number)] = (health, endpoint.zone)
        return found


def _health(endpoint: Endpoint) -> str:
    if endpoint.ready:
        return "HEALTHY"
    return "DRAINING" if endpoint.serving and endpoint.terminating else ""


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    key = ServiceKey(
        draw(st.sampled_from(["default", "shop"])), draw(st.sampled_from(["web", "api", "db"]))
    )
    names = draw(
        st.lists(
            st.sampled_from(["http", "grpc-api", "h2c", "tcp"]), min_size=1, max_size=3, unique=True
        )
    )
    numbers = draw(
        st.lists(st.integers(1, 65535), min_size=len(names), max_size=len(names), unique=True)
    )
    ports = tuple(
        ServicePort(
            name,
            number,
            draw(st.sampled_from(["TCP", "TCP", "UDP"])),
            draw(st.sampled_from(["", "grpc", "http"])),
        )
        for name, number in zip(names, numbers, strict=True)
    )
    service = Service(key, ports)
    if draw(st.booleans()):
        return Workload(service)
    # Some port names may be missing from the slice: their assignment is empty.
    targets = draw(st.lists(st.sampled_from(names), unique=True))
    slice_ports = tuple(EndpointPort(name, draw(st.integers(1, 65535))) for name in targets)
    endpoints = draw(
        st.lists(
            st.builds(
                Endpoint,
                addresses=st.tuples(
                    st.sampled_from(
                        ["10.0.0.1", "10.0.0.2", "10.1.2.3", "fd00::1", "192.168.7.250"]
                    )
                ),
                ready=st.booleans(),
                serving=st.booleans(),
                terminating=st.booleans(),
                zone=st.sampled_from(["", "a", "zone-b", "é"]),
            ),
            max_size=6,
            unique_by=lambda e: e.addresses,
        )
    )
    slice_key = EndpointSetKey("EndpointSlice", key.namespace, f"{key.name}-1")
    group = EndpointGroup(slice_ports, tuple(endpoints))
    return Workload(service, EndpointSet(slice_key, key, (group,)))


registries = st.lists(workloads(), max_size=4, unique_by=lambda w: w.service.key)


@dataclass(frozen=True)
class Expected:
    """What every resource must read as, for one registry and one proxy's certificate."""

    clusters: dict[str, ServicePort]
    hosts: dict[str, dict[tuple[str, int], tuple[str, str]]]
    secrets: dict[str, SecretFacts]

    @classmethod
    def of(cls, registry: list[Workload], secrets: dict[str, SecretFacts]) -> Expected:
        clusters, hosts = {}, {}
        for workload in registry:
            for name, port in workload.clusters().items():
                clusters[name] = port
                hosts[name] = workload.hosts(port)
        return cls(clusters, hosts, secrets)

    def cluster(self, name: str, flavor: Flavor) -> ClusterFacts:
        port = self.clusters[name]
        http2 = port.app_protocol == "grpc" or port.name.startswith(H2_PREFIXES)
        return expected_cluster(name, flavor.value, http2, XDS_CLUSTER)


# --------------------------------------------------------------------------- pilot


@dataclass(eq=False)
class Written:
    """One stream of one proxy; its responses are taken when the test says (`Plane.write`)."""

    proxy: ProxyKey
    kind: StreamKind
    stream: SotwStream | DeltaStream = field(init=False)
    locality: Locality = NOWHERE
    interception: Interception = Interception.REDIRECT
    sidecar: bool = False

    def __post_init__(self) -> None:
        self.stream = self.kind.new_stream()

    def notify(self, type_url: str, names: Iterable[str], started: float) -> bool:
        return self.stream.on_change(type_url, names)

    def wake(self) -> None:
        pass


Response = SotwResponse | DeltaResponse


class Plane:
    """pilot's push path from registry to encoded responses, without the gRPC shell."""

    def __init__(self, authority: CertificateAuthority) -> None:
        index, cache, stats = EndpointIndex(), ResourceCache(), XdsStats()
        ca = LocalCa(authority, asyncio.Semaphore(1))
        self.secrets = SecretManager(ca, authority.root_pem, SdsSettings())
        clusters = ClusterGenerator(index, cache, BuildSettings(), stats)
        endpoints = EndpointGenerator(index, cache, BuildSettings(), stats)
        self.pipeline = Pipeline(
            cache, stats, [clusters, endpoints, SecretGenerator(self.secrets, cache, stats)]
        )
        self._updater = IndexUpdater(index, RequestSink(self.pipeline.submit), stats)

    def publish(self, registry: list[Workload]) -> None:
        services = [w.service for w in registry]
        slices = [w.endpoints for w in registry if w.endpoints is not None]
        self._updater.replace_all(services, slices)
        self.flush()

    def flush(self) -> None:
        """Build and fan out what was submitted, now: the debouncer's timing is not under test."""
        self.pipeline.publish_initial()

    def connect(self, kind: StreamKind, proxy: ProxyKey) -> Written:
        written = Written(proxy, kind)
        self.pipeline.join(written)
        return written

    def ask(self, written: Written, type_url: str, names: Iterable[str] = ()) -> None:
        """A first request for a type (no names: a wildcard)."""
        stream = written.stream
        if isinstance(stream, SotwStream):
            events = stream.on_request(SotwRequest(type_url, tuple(names)))
        else:
            events = stream.on_request(DeltaRequest(type_url, subscribe=tuple(names)))
        self.pipeline.on_events(written, events)

    def write(self, written: Written) -> list[tuple[Response, bytes]]:
        """What the stream's writer would send now, and the bytes it hands gRPC."""
        responses = written.stream.take_responses(self.pipeline.view(written))
        return [(response, convert.encode(response)) for response in responses]


# --------------------------------------------------------------------------- checks


def read_all(
    written: Written, writes: list[tuple[Response, bytes]]
) -> list[tuple[Response, Frame]]:
    """Every response decoded by both libraries (which must agree)."""
    return [(response, read_response(wire, delta=written.kind.delta)) for response, wire in writes]


def check_frame(frame: Frame, response: Response, expected: Expected, flavor: Flavor) -> None:
    """The frame carries what pilot meant to write, and each resource is what the test fed."""
    if isinstance(response, SotwResponse):
        meant: tuple[object, ...] = (response.version_info, {}, ())
    else:
        versions = {r.name: r.version for r in response.resources}
        meant = (response.system_version_info, versions, response.removed)
    assert (frame.type_url, frame.nonce) == (response.type_url, response.nonce)
    assert (frame.version, frame.versions, frame.removed) == meant
    assert list(frame.resources) == [r.name for r in response.resources]
    summaries = frame.summaries()
    for name, summary in summaries.items():
        if frame.type_url == CDS:
            assert summary == expected.cluster(name, flavor)
        elif frame.type_url == EDS:
            assert summary == expected.hosts[name], f"the endpoints of {name}"
        else:
            assert summary == expected.secrets[name]


def sent(frames: list[tuple[Response, Frame]], type_url: str) -> tuple[set[str], set[str]]:
    """(names updated, names removed) over the frames of one type."""
    updated: set[str] = set()
    removed: set[str] = set()
    for _, frame in frames:
        if frame.type_url == type_url:
            updated |= frame.resources.keys()
            removed |= set(frame.removed)
    return updated, removed


def subscribed(plane: Plane, proxy: ProxyKey, assignments: list[str]) -> dict[str, Written]:
    """The proxy's streams, each with its first requests: every stream CDS (a wildcard);
    ADS ones also the `assignments` and the secrets `default` and `ROOTCA`."""
    streams = {label: plane.connect(kind, proxy) for label, kind in STREAMS.items()}
    for label, written in streams.items():
        plane.ask(written, CDS)
        if label.endswith("ads"):
            plane.ask(written, EDS, assignments)
            plane.ask(written, SDS, [WORKLOAD_SECRET, ROOT_SECRET])
    return streams


def exchange(
    plane: Plane, streams: dict[str, Written], expected: Expected
) -> dict[str, list[tuple[Response, Frame]]]:
    """Take, encode, decode and check what every stream is owed now."""
    by_stream = {}
    for label, written in streams.items():
        frames = read_all(written, plane.write(written))
        for response, frame in frames:
            check_frame(frame, response, expected, written.kind.flavor)
        by_stream[label] = frames
    return by_stream


# --------------------------------------------------------------------------- the test


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    """pilot's CA as it starts without plugged-in files: a new self-signed root."""
    return CertificateAuthority.load(CaSettings(state_dir=Path(tmp_path_factory.mktemp("ca"))))


WEB = Workload(
    Service(
        ServiceKey("default", "web"),
        (ServicePort("grpc-api", 90), ServicePort("http", 80), ServicePort("dns", 53, "UDP")),
    ),
    EndpointSet(
        EndpointSetKey("EndpointSlice", "default", "web-1"),
        ServiceKey("default", "web"),
        (
            EndpointGroup(
                (EndpointPort("http", 8080),),
                (
                    Endpoint(("10.0.0.1",), zone="a"),
                    Endpoint(("fd00::1",), ready=False, serving=True, terminating=True),
                ),
            ),
        ),
    ),
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    before=registries,
    after=registries,
    account=st.tuples(st.sampled_from(["default", "ns-b"]), st.sampled_from(["sa", "victim-1"])),
)
@example(before=[WEB], after=[], account=("default", "sa"))  # grpc, UDP, empty, draining, gone
async def test_every_response_reads_the_same_in_envoy_data_plane(
    authority: CertificateAuthority,
    before: list[Workload],
    after: list[Workload],
    account: tuple[str, str],
) -> None:
    namespace, service_account = account
    proxy = ProxyKey(
        f"sidecar~10.0.0.9~pod.{namespace}~{namespace}.svc.cluster.local",
        f"spiffe://cluster.local/ns/{namespace}/sa/{service_account}",
    )
    root = SecretFacts(ROOT_SECRET, trusted_ca_sha256=digest(authority.root_pem.encode()))
    old = Expected.of(before, {ROOT_SECRET: root})
    plane = Plane(authority)
    plane.publish(before)
    streams = subscribed(plane, proxy, [*old.clusters, GHOST])
    try:
        first = exchange(plane, streams, old)
        for label, frames in first.items():
            assert sent(frames, CDS)[0] == set(old.clusters), label
        assert sent(first["delta-ads"], EDS)[1] == {GHOST}
        for label in ("ads", "delta-ads"):
            assert sent(first[label], SDS)[0] == {ROOT_SECRET}, label

        certificate = await wait_until(
            lambda: plane.secrets.current(proxy), 10, "the proxy's first certificate"
        )
        chain, key = digest(certificate.chain_pem), digest(certificate.key_pem)
        secrets = {ROOT_SECRET: root, WORKLOAD_SECRET: SecretFacts(WORKLOAD_SECRET, chain, key)}
        plane.flush()
        minted = exchange(plane, streams, replace(old, secrets=secrets))
        for label in ("ads", "delta-ads"):
            assert sent(minted[label], SDS)[0] == {WORKLOAD_SECRET}, label

        new = Expected.of(after, secrets)
        plane.publish(after)
        later = exchange(plane, streams, new)
        gone = set(old.clusters) - set(new.clusters)
        assert sent(later["delta-cds"], CDS)[1] == gone
        assert sent(later["delta-ads"], CDS)[1] == gone
        assert sent(later["delta-ads"], EDS)[1] == gone
    finally:
        await plane.secrets.close()
