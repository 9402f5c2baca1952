"""The inbound tests' mesh: the real pipeline, cache, index updater and generators
(clusters, outbound listeners, inbound), with streams that are plain protocol machines
driven by hand as Envoy would over ADS (SotW and delta).

`mesh()` builds it; `Mesh.connect` joins a sidecar's stream and applies what it is sent
to what it holds; `chains`, `inbound_clusters` and `listener` read a stream's
`virtualInbound` and `inbound|P||` clusters; `svc`, `endpoints` and `reviews` fill
the registry.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from envoy.config.listener.v3 import listener_pb2

from pilot.builders.inbound import VIRTUAL_INBOUND
from pilot.builders.outbound import OutboundSettings
from pilot.builders.settings import BuildSettings
from pilot.generators.cds import ClusterGenerator
from pilot.generators.eds import EndpointGenerator
from pilot.generators.inbound_proxies import InboundGenerator
from pilot.generators.lds import ListenerGenerator
from pilot.protocol import DeltaStream, SotwStream
from pilot.protocol.kind import StreamKind
from pilot.protocol.messages import DeltaRequest, SotwRequest
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
from pilot.registry.peer_authentication import PeerAuthentications
from pilot.registry.updater import IndexUpdater
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.flavor import Flavor
from pilot.xds.interception import Interception
from pilot.xds.locality import NOWHERE, Locality
from pilot.xds.proxy import ProxyKey

ADS = StreamKind(False, None, Flavor.ADS)
DELTA_ADS = StreamKind(True, None, Flavor.ADS)
CDS_ONLY = StreamKind(False, types.CLUSTER, Flavor.GRPC)


def sidecar(ip: str, namespace: str = "shop", identity: str | None = None) -> ProxyKey:
    return ProxyKey(f"sidecar~{ip}~pod-{ip}.{namespace}~{namespace}.svc.cluster.local", identity)


@dataclass(eq=False)
class Stream:
    proxy: ProxyKey
    kind: StreamKind
    stream: SotwStream | DeltaStream
    interception: Interception = Interception.REDIRECT
    sidecar: bool = False
    locality: Locality = NOWHERE
    notified: list[str] = field(default_factory=list)
    held: dict[str, dict[str, bytes]] = field(default_factory=dict)

    def notify(self, type_url: str, names: Iterable[str], started: float) -> bool:
        if not self.stream.on_change(type_url, names):
            return False
        self.notified.append(types.short_name(type_url))
        return True

    def wake(self) -> None:
        pass


@dataclass
class Mesh:
    pipeline: Pipeline
    updater: IndexUpdater
    inbound: InboundGenerator
    cache: ResourceCache

    def connect(
        self,
        proxy: ProxyKey,
        kind: StreamKind = ADS,
        interception: Interception = Interception.REDIRECT,
    ) -> Stream:
        stream = Stream(proxy, kind, kind.new_stream(), interception)
        self.pipeline.join(stream)
        for type_url in (types.CLUSTER, types.LISTENER):
            if kind.fixed_type not in (None, type_url):
                continue
            if isinstance(stream.stream, SotwStream):
                events = stream.stream.on_request(SotwRequest(type_url, ()))
            else:
                events = stream.stream.on_request(DeltaRequest(type_url, ("*",), ()))
            self.pipeline.on_events(stream, events)
        self.take(stream)
        return stream

    def take(self, stream: Stream) -> dict[str, dict[str, bytes]]:
        """Apply what the stream is sent now to what it holds (as Envoy would)."""
        for response in stream.stream.take_responses(self.pipeline.view(stream)):
            short = types.short_name(response.type_url)
            held = stream.held.setdefault(short, {})
            if isinstance(stream.stream, SotwStream):
                held.clear()  # wildcard SotW: the full set every time
            for name in getattr(response, "removed", ()):
                held.pop(name, None)
            for resource in response.resources:
                held[resource.name] = resource.payload
        return stream.held

    def flush(self) -> None:
        self.pipeline.publish_initial()  # builds everything submitted, now


@contextmanager
def mesh() -> Iterator[Mesh]:
    index, cache, stats = EndpointIndex(), ResourceCache(), XdsStats()
    policies = PeerAuthentications()
    build = BuildSettings()
    inbound = InboundGenerator(index, cache, policies, stats)
    generators = [
        ClusterGenerator(index, cache, build, stats),
        EndpointGenerator(index, cache, build, stats),
        ListenerGenerator(index, cache, OutboundSettings(), build, stats),
        inbound,
    ]
    pipeline = Pipeline(cache, stats, generators)
    updater = IndexUpdater(index, RequestSink(pipeline.submit), stats, policies)
    yield Mesh(pipeline, updater, inbound, cache)


def svc(name: str, *ports: tuple[str, int], namespace: str = "shop") -> Service:
    return Service(
        ServiceKey(namespace, name),
        tuple(ServicePort(n, p) for n, p in ports),
        cluster_ip=f"10.96.0.{len(name)}",
    )


def endpoints(
    service: str, ips: Iterable[str], *ports: tuple[str, int], namespace: str = "shop"
) -> EndpointSet:
    return EndpointSet(
        EndpointSetKey("EndpointSlice", namespace, f"{service}-1"),
        ServiceKey(namespace, service),
        (
            EndpointGroup(
                tuple(EndpointPort(n, p) for n, p in ports),
                tuple(Endpoint((ip,)) for ip in ips),
            ),
        ),
    )


def listener(stream: Stream) -> listener_pb2.Listener:
    message = listener_pb2.Listener()
    message.ParseFromString(stream.held["lds"][VIRTUAL_INBOUND])
    return message


def chains(stream: Stream) -> list[str]:
    return [chain.name for chain in listener(stream).filter_chains]


def inbound_clusters(stream: Stream) -> set[str]:
    return {name for name in stream.held.get("cds", {}) if name.startswith("inbound|")}


def reviews(m: Mesh, ips: Iterable[str] = ("10.1.0.1",)) -> None:
    m.updater.upsert_service(svc("reviews", ("http", 9080), ("grpc-api", 9090), ("tcp-db", 5432)))
    m.updater.upsert_endpoints(
        endpoints("reviews", ips, ("http", 8080), ("grpc-api", 9090), ("tcp-db", 5432))
    )
