"""The push pipeline with secrets: one proxy's certificate reaches that proxy only;
and each push leaves a record in the bounded history the /debug page shows.

A proxy is a node id *and* the identity its streams proved. Streams here are
plain protocol machines (no gRPC), the certificate source a stand-in that
mints when told to; the pipeline, cache, subscriber index and SDS generator
are the real ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from pilot.generators.sds import SecretGenerator
from pilot.protocol import DeltaStream, SotwStream
from pilot.protocol.kind import StreamKind
from pilot.protocol.messages import DeltaRequest, SotwRequest
from pilot.push.history import SAMPLED, PushHistory, PushRecord, Sample
from pilot.push.pipeline import Pipeline, flavors_of
from pilot.push.request import PushRequest
from pilot.registry.index import IndexChange
from pilot.registry.model import ServiceKey
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.flavor import ADS_WITH_LISTENERS, Flavor
from pilot.xds.interception import Interception
from pilot.xds.locality import NOWHERE, Locality
from pilot.xds.proxy import ProxyKey
from tests.support.envoy_process import wait_until

NODE = "sidecar~10.0.0.2~victim-1.ns-b~ns-b.svc.cluster.local"
VICTIM = ProxyKey(NODE, "spiffe://cluster.local/ns/ns-b/sa/victim")
ATTACKER = ProxyKey(NODE, "spiffe://cluster.local/ns/ns-a/sa/attacker")
ADS = StreamKind(False, None, Flavor.ADS)
DELTA_ADS = StreamKind(True, None, Flavor.ADS)


@dataclass(frozen=True)
class Minted:
    chain_pem: bytes
    key_pem: bytes = field(repr=False)


class Certificates:
    """A certificate source that mints only when the test says so."""

    def __init__(self) -> None:
        self.wanted: dict[ProxyKey, Callable[[ProxyKey], None]] = {}
        self.released: list[ProxyKey] = []
        self.minted: dict[ProxyKey, Minted] = {}
        self.serial = 0

    def want(self, proxy: ProxyKey, ready: Callable[[ProxyKey], None]) -> bool:
        self.wanted[proxy] = ready
        return True

    def release(self, proxy: ProxyKey) -> None:
        self.released.append(proxy)
        self.wanted.pop(proxy, None)
        self.minted.pop(proxy, None)

    def current(self, proxy: ProxyKey) -> Minted | None:
        return self.minted.get(proxy)

    def root_pem(self) -> str | None:
        return "the root"

    def mint(self, proxy: ProxyKey) -> Minted:
        self.serial += 1
        minted = Minted(f"chain {self.serial} for {proxy.identity}".encode(), b"key")
        self.minted[proxy] = minted
        self.wanted[proxy](proxy)
        return minted


@dataclass(eq=False)
class Stream:
    """A stream of one proxy, driven by hand; records what it was told changed."""

    proxy: ProxyKey
    kind: StreamKind
    stream: SotwStream | DeltaStream
    notified: list[tuple[str, frozenset[str]]] = field(default_factory=list)
    locality: Locality = NOWHERE
    interception: Interception = Interception.REDIRECT
    sidecar: bool = False

    def notify(self, type_url: str, names: Iterable[str], started: float) -> bool:
        names = frozenset(names)
        if not self.stream.on_change(type_url, names):
            return False
        self.notified.append((type_url, names))
        return True

    def wake(self) -> None:
        pass


@dataclass
class Plane:
    pipeline: Pipeline
    cache: ResourceCache
    certificates: Certificates

    def connect(self, proxy: ProxyKey, kind: StreamKind = ADS) -> Stream:
        stream = Stream(proxy, kind, kind.new_stream())
        self.pipeline.join(stream)
        return stream

    def sotw(self, stream: Stream, *names: str) -> None:
        assert isinstance(stream.stream, SotwStream)
        events = stream.stream.on_request(SotwRequest(types.SECRET, names))
        self.pipeline.on_events(stream, events)

    def delta(
        self, stream: Stream, subscribe: Iterable[str] = (), unsubscribe: Iterable[str] = ()
    ) -> None:
        assert isinstance(stream.stream, DeltaStream)
        request = DeltaRequest(types.SECRET, tuple(subscribe), tuple(unsubscribe))
        self.pipeline.on_events(stream, stream.stream.on_request(request))

    def held(self, stream: Stream) -> dict[str, bytes]:
        """name -> payload of every secret the stream is sent now."""
        view = self.pipeline.view(stream)
        return {
            resource.name: resource.payload
            for response in stream.stream.take_responses(view)
            for resource in response.resources
        }


@asynccontextmanager
async def plane() -> AsyncIterator[Plane]:
    cache, certificates, stats = ResourceCache(), Certificates(), XdsStats()
    pipeline = Pipeline(cache, stats, [SecretGenerator(certificates, cache, stats)])
    pipeline.publish_initial()
    task = asyncio.create_task(pipeline.run())
    try:
        yield Plane(pipeline, cache, certificates)
    finally:
        task.cancel()


async def test_a_certificate_reaches_only_the_streams_of_its_proxy() -> None:
    async with plane() as p:
        victim, attacker = p.connect(VICTIM), p.connect(ATTACKER, DELTA_ADS)
        p.sotw(victim, "default", "ROOTCA")
        p.delta(attacker, ["default"])
        assert set(p.certificates.wanted) == {VICTIM, ATTACKER}, "one certificate per identity"
        assert set(p.held(victim)) == {"ROOTCA"}, "the root at once, `default` once minted"
        assert p.held(attacker) == {}

        minted = p.certificates.mint(VICTIM)
        await wait_until(lambda: victim.notified, 5, "the victim's push")
        assert attacker.notified == [], "a push for the victim never wakes the attacker"
        assert minted.chain_pem in p.held(victim)["default"]
        assert p.held(attacker) == {}, "the attacker's stream has nothing to send"
        attacker_view = p.pipeline.view(attacker)
        assert attacker_view.get(types.SECRET, "default") is None
        assert attacker_view.pending(types.SECRET, "default"), "its own is still being minted"


async def test_the_last_stream_of_a_proxy_releases_its_certificate() -> None:
    async with plane() as p:
        first, second = p.connect(VICTIM), p.connect(VICTIM, DELTA_ADS)
        attacker = p.connect(ATTACKER)
        p.sotw(first, "default")
        p.delta(second, ["default"])
        p.sotw(attacker, "default")
        p.certificates.mint(VICTIM)
        await wait_until(lambda: len(first.notified) and len(second.notified), 5, "both pushes")

        p.pipeline.leave(attacker)
        p.sotw(first)  # SotW: an empty list after names unsubscribes
        assert p.certificates.released == [ATTACKER], "the victim's second stream still wants it"
        p.delta(second, unsubscribe=["default"])
        assert p.certificates.released == [ATTACKER, VICTIM]
        assert p.cache.get(types.SECRET, "default", owner=VICTIM) is None


async def test_a_secret_wildcard_mints_nothing_and_gets_nothing() -> None:
    async with plane() as p:
        sotw, delta = p.connect(ATTACKER), p.connect(ATTACKER, DELTA_ADS)
        victim = p.connect(VICTIM)
        p.sotw(victim, "default")
        p.certificates.mint(VICTIM)
        p.sotw(sotw)
        p.delta(delta, ["*"])
        assert set(p.certificates.wanted) == {VICTIM}
        assert p.held(sotw) == {} and p.held(delta) == {}


async def test_the_root_is_shared_by_every_proxy_and_mints_nothing() -> None:
    async with plane() as p:
        victim, attacker = p.connect(VICTIM), p.connect(ATTACKER)
        p.sotw(victim, "ROOTCA")
        p.sotw(attacker, "ROOTCA")
        assert set(p.held(victim)) == set(p.held(attacker)) == {"ROOTCA"}
        assert p.certificates.wanted == {}, "the root needs no certificate"


async def test_each_push_leaves_a_record_of_what_it_changed_and_whom_it_reached() -> None:
    async with plane() as p:
        victim, attacker = p.connect(VICTIM), p.connect(ATTACKER)
        p.sotw(victim, "default")
        p.sotw(attacker, "default")
        before = len(p.pipeline.history)
        p.certificates.mint(VICTIM)
        await wait_until(lambda: len(p.pipeline.history) > before, 5, "the push's record")
        [push] = list(p.pipeline.history)[before:]
    assert push.certificates == Sample(1, (f"{NODE} ({VICTIM.identity})",))
    assert (push.full.total, push.endpoints.total) == (0, 0)
    assert push.owned == 1 and push.resources == {}, "the secret is the victim's own"
    assert push.streams == 1, "only the victim's stream was woken"
    assert push.seconds >= 0 and push.debounce_seconds >= 0


def test_the_push_history_keeps_the_last_hundred_each_of_bounded_size() -> None:
    many = frozenset(ServiceKey("ns", f"svc-{i:04}") for i in range(5000))
    history = PushHistory()
    for i in range(150):
        request = PushRequest(IndexChange(endpoints=many if i == 149 else frozenset()))
        history.record(_record(request, at=float(i)))
    assert len(history) == 100
    newest = history.newest_first()
    assert [r.at for r in (newest[0], newest[-1])] == [149.0, 50.0], "oldest fell off first"
    assert newest[0].endpoints.total == 5000
    assert len(newest[0].endpoints.names) == SAMPLED, "a record keeps a few names, not all"


def _record(request: PushRequest, at: float) -> PushRecord:
    return PushRecord.of(
        request,
        at=at,
        resources={},
        owned=0,
        streams=0,
        debounce_seconds=0.0,
        build_seconds=0.0,
        fan_out_seconds=0.0,
    )


def test_a_declared_sidecar_reads_sidecar_clusters_from_its_first_answer() -> None:
    """A node that declares INTERCEPTION_MODE (what `pilot agent` writes) is a sidecar:
    its clusters are the listener-reading flavor at once, so that asking for listeners
    later does not change (and send again) every cluster and its assignment."""
    declared = Stream(VICTIM, DELTA_ADS, DELTA_ADS.new_stream(), sidecar=True)
    undeclared = Stream(ATTACKER, DELTA_ADS, DELTA_ADS.new_stream())
    standalone = Stream(
        VICTIM,
        StreamKind(True, types.CLUSTER, Flavor.DELTA_GRPC),
        sidecar=True,
        stream=StreamKind(True, types.CLUSTER, Flavor.DELTA_GRPC).new_stream(),
    )
    assert flavors_of(declared)[types.CLUSTER] == ADS_WITH_LISTENERS
    assert flavors_of(undeclared)[types.CLUSTER] == Flavor.ADS.value
    assert flavors_of(standalone)[types.CLUSTER] == Flavor.DELTA_GRPC.value
