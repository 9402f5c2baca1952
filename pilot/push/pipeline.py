"""The push pipeline: submit -> debounce -> build -> cache -> fan-out, for every type.

Sources submit registry changes (through `IndexUpdater` and `RequestSink`); generators that
watch something for a proxy (the SDS generator, while a certificate is being
kept) submit through the callback they were given. Both are `PushRequest`s,
merged by the debouncer. A flush hands the request to every generator, which
builds what changed, once, into the cache and reports the names that really
changed (`Changes`). Fan-out then marks those names on exactly the streams
that watch them (`SubscriberIndex`): shared names on their subscribers, a
proxy's own names on that proxy's streams only, and wakes their writers.
Each flush leaves one record in `history` (the last 100, `PushHistory`).

Streams tell the pipeline what they subscribe to (`join`, `on_events`,
`leave`). For types whose resources belong to one proxy (`OWNED_TYPES`), the
first stream of a proxy to name a resource makes its generator `watch` it,
the last to let go `unwatch` it. Streams read one consistent state through
`view`: clusters in the flavor of the RPC they came in on, assignments in the
variant of their proxy's locality. The first stream of a locality makes the
generators that build per locality (`LocalityGenerator`) build its variant,
the last to leave makes them drop it. Variants are rationed by what streams
proved (`LocalityBudget`, push/localities.py): a locality is whatever a proxy
declares, so streams that proved no identity share a small budget of their
own and never take a proven proxy's. The first stream of a proxy makes the
generators that give proxies resources of their own inside a wildcard type
(`ProxyGenerator`: a sidecar's inbound listener and clusters) `attach` it, the
last to leave `detach` it; what they build for it reaches only its streams
(`Changes.owned`), through an overlay the cache lays over the shared table
(`ResourceCache.set_overlay`). Generators whose resources depend on who a proxy is
and on its interception mode (`ClientGenerator`: route configurations of sidecars
that VirtualServices single out, clusters of namespaces with DestinationRules of
their own) are told of its first stream's mode and locality and of its last
stream leaving, and lay theirs the same way. Nothing here touches gRPC.

A new resource type plugs in as a generator (its `type_urls` and `build`)
handed to the pipeline by the composition root.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Protocol, runtime_checkable

from pilot.protocol.kind import StreamKind
from pilot.protocol.messages import StreamEvent, SubscriptionChanged
from pilot.protocol.node import streams_to_wake
from pilot.protocol.stream import StreamCore
from pilot.push.deadlines import WriteDeadlines
from pilot.push.debounce import Debouncer
from pilot.push.history import PushHistory, PushRecord
from pilot.push.localities import Joined, LocalityBudget
from pilot.push.request import Changes, PushRequest
from pilot.push.settings import DebounceSettings, PushSettings
from pilot.push.subscribers import SubscriberIndex
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import Flavors, ProxyView, ResourceCache
from pilot.xds.flavor import ADS_WITH_LISTENERS, Flavor
from pilot.xds.interception import Interception
from pilot.xds.locality import NOWHERE, Locality
from pilot.xds.proxy import ProxyKey

log = logging.getLogger("pilot.push")
MAX_REFUSALS_LOGGED = 16  # distinct localities refused a variant that are logged


class Subscriber(Protocol):
    """A stream, as the pipeline drives it (the gRPC shell's connection)."""

    # Who it speaks for; `proxy.identity` is what it proved (None: nothing), which
    # decides the locality budget it draws on.
    @property
    def proxy(self) -> ProxyKey: ...

    @property
    def kind(self) -> StreamKind: ...

    @property
    def stream(self) -> StreamCore: ...

    # The locality its proxy declared (empty: none); the pipeline sets it back to none
    # when it serves that proxy no variant of its own (PILOT_MAX_LOCALITIES, or
    # PILOT_MAX_UNVERIFIED_LOCALITIES for a stream that proved no identity).
    locality: Locality

    # The interception mode its node declared: which listeners and routes it reads.
    @property
    def interception(self) -> Interception: ...

    # Whether its node declared a mode at all, as the bootstraps of `pilot agent` and
    # Istio's agent do: it is a sidecar, and reads sidecars' clusters from the start.
    @property
    def sidecar(self) -> bool: ...

    def notify(self, type_url: str, names: Iterable[str], started: float) -> bool:
        """Mark changed names; True if the stream cares (and was woken)."""
        ...

    def wake(self) -> None:
        """The stream's machine has work marked: let its writer run."""
        ...


class Generator(Protocol):
    """Builds the resources of some types into the cache."""

    @property
    def type_urls(self) -> frozenset[str]: ...

    def build(self, request: PushRequest) -> Changes:
        """Rebuild what the request touches; return the names whose resource changed."""
        ...


@runtime_checkable
class OwnedGenerator(Generator, Protocol):
    """A generator of resources that belong to one proxy, made while some stream wants them."""

    def watch(
        self, proxy: ProxyKey, type_url: str, name: str, changed: Callable[[PushRequest], None]
    ) -> bool:
        """Start making `name` for `proxy`; False if no such resource is made here."""
        ...

    def unwatch(self, proxy: ProxyKey, type_url: str, name: str) -> None: ...


@runtime_checkable
class LocalityGenerator(Generator, Protocol):
    """A generator whose shared resources come in one variant per proxy locality in use."""

    def add_locality(self, locality: Locality) -> None:
        """Build the variant for proxies in `locality` (the first of them joined)."""
        ...

    def drop_locality(self, locality: Locality) -> None: ...


@runtime_checkable
class ProxyGenerator(Generator, Protocol):
    """A generator of resources some proxies read beside the shared ones of a wildcard type.

    It lays them over the shared table for that proxy (`ResourceCache.set_overlay`) and
    reports changes to them as the proxy's own (`Changes.owned`), so only its streams
    are woken; a proxy it gives nothing reads the shared tables as before.
    """

    def attach(self, proxy: ProxyKey) -> None:
        """The first stream of `proxy` joined: lay its overlays (before it is answered)."""
        ...

    def detach(self, proxy: ProxyKey) -> None:
        """The last stream of `proxy` left: drop its overlays."""
        ...


@runtime_checkable
class ClientGenerator(Generator, Protocol):
    """A generator some of whose resources depend on who a proxy is (its proven namespace,
    its Pod's labels) and on its interception mode: route configurations.

    It lays them over the shared table for that proxy and reports changes to them as the
    proxy's own, as a `ProxyGenerator` does.
    """

    def client_joined(
        self, proxy: ProxyKey, interception: Interception, locality: Locality
    ) -> None:
        """The first stream of `proxy` joined, declaring `interception`, reading the
        assignments of `locality` (NOWHERE: none of its own)."""
        ...

    def client_left(self, proxy: ProxyKey) -> None:
        """The last stream of `proxy` left."""
        ...


class PipelineMetrics(Protocol):
    """What the pipeline reports as it runs."""

    def debounced(self, seconds: float) -> None: ...

    def locality_refused(self, proven: bool) -> None:
        """A stream's locality got no variant: its budget (proven or not) was full."""
        ...


class _NoMetrics:
    def debounced(self, seconds: float) -> None:
        pass

    def locality_refused(self, proven: bool) -> None:
        pass


def flavors_of(subscriber: Subscriber) -> Flavors:
    """The flavor a stream reads of each type: its RPC's clusters (sidecars' over ADS, with
    the ones listeners name, once it reads listeners or if it declared itself a sidecar),
    its locality's endpoints, its mode's listeners and routes."""
    clusters = subscriber.kind.flavor.value
    if subscriber.kind.flavor is Flavor.ADS and (
        subscriber.sidecar or subscriber.stream.state(types.LISTENER) is not None
    ):
        # A declared sidecar gets them in its first answer: were they to change once it
        # asks for listeners, every cluster (and its assignment) would be sent twice.
        clusters = ADS_WITH_LISTENERS
    mode = subscriber.interception.value
    return {
        types.CLUSTER: clusters,
        types.ENDPOINT: subscriber.locality.flavor,
        types.LISTENER: mode,
        types.ROUTE: mode,
    }


class Pipeline:
    """Owns debounce, build, cache and fan-out; streams and sources only submit and read."""

    def __init__(
        self,
        cache: ResourceCache,
        stats: XdsStats,
        generators: Sequence[Generator],
        *,
        debounce: DebounceSettings | None = None,
        push: PushSettings | None = None,
        metrics: PipelineMetrics | None = None,
        history: PushHistory | None = None,
    ) -> None:
        self.cache = cache
        self.settings = push or PushSettings()
        self.served_types = frozenset(t for g in generators for t in g.type_urls)
        # Bounds the responses being built and written at once, across all streams.
        self.push_slots = asyncio.Semaphore(self.settings.throttle)
        # The send timeout of the writes in flight, all on one timer.
        self.write_deadlines = WriteDeadlines(self.settings.send_timeout)
        # Set once the first full state is built: streams answer nothing before.
        self.ready = asyncio.Event()
        self._stats = stats
        self._metrics = metrics or _NoMetrics()
        # One record per flush, for the operator (the /debug page): bounded, cheap.
        self.history = history if history is not None else PushHistory()
        self._generators = tuple(generators)
        self._owners = {
            type_url: generator
            for generator in generators
            if isinstance(generator, OwnedGenerator)
            for type_url in generator.type_urls & types.OWNED_TYPES
        }
        self._localized = [g for g in generators if isinstance(g, LocalityGenerator)]
        self._per_proxy = [g for g in generators if isinstance(g, ProxyGenerator)]
        self._per_client = [g for g in generators if isinstance(g, ClientGenerator)]
        self._localities = LocalityBudget(
            self.settings.max_localities, self.settings.max_unverified_localities
        )
        # Each joined stream's locality with a variant (NOWHERE: none) and whether it proved
        # an identity, as it joined: what leaving gives back.
        self._joined: dict[Subscriber, tuple[Locality, bool]] = {}
        self._refused: set[Locality] = set()  # localities refused a variant, as logged
        self._debouncer = Debouncer(debounce or DebounceSettings())
        self._subscribers: SubscriberIndex[Subscriber] = SubscriberIndex()

    # -- what goes in ------------------------------------------------------------

    def submit(self, request: PushRequest) -> None:
        """A change to push (merged with others until the debouncer lets it go)."""
        self._debouncer.submit(request)

    def publish_initial(self) -> None:
        """Build everything submitted so far at once, then let streams be answered."""
        request, since = self._debouncer.take()
        self._flush(request, since)
        self.ready.set()

    async def run(self) -> None:
        """Push what is submitted, debounced, until cancelled."""
        await self._debouncer.run(self._flush)

    # -- build and fan-out -------------------------------------------------------

    def _flush(self, request: PushRequest, started: float) -> None:
        flushed = time.monotonic()
        self._metrics.debounced(flushed - started)
        changes = Changes()
        for generator in self._generators:
            changes.add(generator.build(request))
        built = time.monotonic()
        woken = self._fan_out(changes, started) if changes else 0
        self._record(request, changes, woken, (started, flushed, built, time.monotonic()))

    def _record(
        self, request: PushRequest, changes: Changes, woken: int, times: tuple[float, ...]
    ) -> None:
        """Log the push and keep its record; `times`: started, flushed, built, fanned out."""
        started, flushed, built, done = times
        counts = {types.short_name(t): len(n) for t, n in changes.shared.items()}
        if changes:
            log.debug(
                "push %s and %d proxies' own to %d streams", counts, len(changes.owned), woken
            )
        record = PushRecord.of(
            request,
            at=time.time(),
            resources=counts,
            owned=len(changes.owned),
            streams=woken,
            debounce_seconds=flushed - started,
            build_seconds=built - flushed,
            fan_out_seconds=done - built,
        )
        self.history.record(record)

    def _fan_out(self, changes: Changes, started: float) -> int:
        """Mark changed names on the streams that watch them; returns streams woken."""
        woken: set[Subscriber] = set()
        for type_url in sorted(changes.shared, key=types.push_rank):
            names = changes.shared[type_url]
            for subscriber in self._subscribers.watchers(type_url, names):
                if subscriber.notify(type_url, names, started):
                    woken.add(subscriber)
        for proxy, by_type in changes.owned.items():
            for subscriber in self._subscribers.streams_of(proxy):
                for type_url in sorted(by_type, key=types.push_rank):
                    if subscriber.notify(type_url, by_type[type_url], started):
                        woken.add(subscriber)
        self._stats.pushes += 1
        self._stats.streams_woken += len(woken)
        return len(woken)

    # -- streams -------------------------------------------------------------------

    def view(self, subscriber: Subscriber) -> ProxyView:
        """What this stream may read: its flavor of the shared resources, and its own."""
        return self.cache.view(flavors_of(subscriber), subscriber.proxy)

    def shared_view(self, flavors: Flavors) -> ProxyView:
        """The shared resources of these flavors (no proxy's own)."""
        return self.cache.view(flavors)

    def in_the_making(self, type_url: str, name: str, proxy: ProxyKey) -> bool:
        """Whether `name` is still being made for `proxy` (a certificate being minted)."""
        return self.cache.pending(type_url, name, proxy)

    def push_slot(self) -> asyncio.Semaphore:
        """One of the slots that bound the responses built and written at once."""
        return self.push_slots

    @contextlib.contextmanager
    def writing(self, writer: Hashable, on_timeout: Callable[[], None]) -> Iterator[None]:
        """A write in flight, ended by `on_timeout` if it outlives the send timeout (a
        deadline rather than a cancellation: a cancelled write stays in gRPC anyway)."""
        deadlines = self.write_deadlines
        if deadlines.timeout:
            deadlines.started(writer, on_timeout)
        try:
            yield
        finally:
            deadlines.ended(writer)

    def join(self, subscriber: Subscriber) -> None:
        """A stream identified its proxy (on its first request)."""
        self._subscribers.join(subscriber)
        first = len(self._subscribers.streams_of(subscriber.proxy)) == 1
        if first:
            for attaching in self._per_proxy:
                attaching.attach(subscriber.proxy)
        locality = subscriber.locality
        proven = subscriber.proxy.identity is not None
        if locality:
            joined = self._localities.join(locality, proven)
            if joined is Joined.REFUSED:
                self._refuse_locality(locality, subscriber, proven)
                locality = subscriber.locality = NOWHERE
            elif joined is Joined.NEW:
                for generator in self._localized:
                    generator.add_locality(locality)
        self._joined[subscriber] = (locality, proven)
        for joining in self._per_client if first else ():
            joining.client_joined(subscriber.proxy, subscriber.interception, locality)

    def _refuse_locality(self, locality: Locality, subscriber: Subscriber, proven: bool) -> None:
        """Count and log a stream served no variant: a locality is whatever a proxy declares,
        and each costs a copy of every assignment, rebuilt on every change."""
        self._metrics.locality_refused(proven)
        if len(self._refused) >= MAX_REFUSALS_LOGGED or locality in self._refused:
            return
        self._refused.add(locality)
        budget = (
            "PILOT_MAX_LOCALITIES"
            if proven
            else "PILOT_MAX_UNVERIFIED_LOCALITIES, for streams that proved no identity"
        )
        log.warning(
            "proxy %s declares locality %r: pilot already builds assignments for %d"
            " localities (%s); it gets those of proxies without a locality",
            subscriber.proxy,
            str(locality)[:200],
            self._localities.charged(proven),
            budget,
        )

    def _forget_locality(self, subscriber: Subscriber) -> None:
        locality, proven = self._joined.pop(subscriber, (NOWHERE, False))
        if locality and self._localities.leave(locality, proven):
            for generator in self._localized:
                generator.drop_locality(locality)

    def on_events(self, subscriber: Subscriber, events: Iterable[StreamEvent]) -> list[str]:
        """What a request meant: subscription changes, and replies other streams follow.

        Returns the names of per-proxy resources asked for that are not made here.
        """
        siblings = self._subscribers.streams_of(subscriber.proxy)
        unknown: list[str] = []
        self._follow_flavors(subscriber, events)
        for event in events:
            if isinstance(event, SubscriptionChanged):
                state = subscriber.stream.state(event.type_url)
                names = state.subscription.names if state is not None else frozenset()
                self._subscribers.apply(subscriber, event.type_url, names, event.wildcard)
                unknown += self._watch_owned(subscriber.proxy, event.type_url, event.added)
                self._unwatch_owned(subscriber.proxy, event.type_url, event.removed)
            for sibling in streams_to_wake(subscriber, event, siblings):
                sibling.wake()
        return unknown

    @staticmethod
    def _follow_flavors(subscriber: Subscriber, events: Iterable[StreamEvent]) -> None:
        """A stream that starts reading listeners reads other clusters (`flavors_of`):
        every cluster it subscribes to is reconsidered against them."""
        listens = any(
            isinstance(e, SubscriptionChanged) and e.type_url == types.LISTENER for e in events
        )
        if listens and subscriber.stream.on_full_change(types.CLUSTER):
            subscriber.wake()

    def leave(self, subscriber: Subscriber) -> None:
        """A stream ended: forget its subscriptions; its proxy may let go of secrets."""
        subscriptions = subscriber.stream.subscriptions()
        self._subscribers.leave(subscriber, [type_url for type_url, _ in subscriptions])
        self._forget_locality(subscriber)
        if not self._subscribers.streams_of(subscriber.proxy):
            for detaching in self._per_proxy:
                detaching.detach(subscriber.proxy)
            for leaving in self._per_client:
                leaving.client_left(subscriber.proxy)
        for type_url, names in subscriptions:
            self._unwatch_owned(subscriber.proxy, type_url, names)

    def _watch_owned(self, proxy: ProxyKey, type_url: str, names: Iterable[str]) -> list[str]:
        """The first stream of a proxy naming its own resource makes its generator watch it.

        Returns the names the generator does not make.
        """
        owner = self._owners.get(type_url)
        if owner is None:
            return []
        unknown = []
        for name in names:
            first = self._subscribers.proxy_watchers(proxy, type_url, name) == 1
            if first and not owner.watch(proxy, type_url, name, self.submit):
                unknown.append(name)
        return unknown

    def _unwatch_owned(self, proxy: ProxyKey, type_url: str, names: Iterable[str]) -> None:
        """The last stream of a proxy to let go of its own resource makes the generator stop."""
        owner = self._owners.get(type_url)
        if owner is None:
            return
        for name in names:
            if self._subscribers.proxy_watchers(proxy, type_url, name) == 0:
                owner.unwatch(proxy, type_url, name)
