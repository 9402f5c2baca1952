"""The push pipeline with secrets: one proxy's certificate reaches that proxy only.

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
from pilot.push.pipeline import Pipeline
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.flavor import Flavor
from pilot.xds.proxy import ProxyKey
from tests.harness.envoy_process import wait_until

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
