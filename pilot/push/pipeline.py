"""The push pipeline: submit -> debounce -> build -> cache -> fan-out, for every type.

Sources submit registry changes (through `IndexUpdater`), the secret manager
submits proxies with a new certificate; both are `PushRequest`s, merged by
the debouncer. A flush builds what changed, once: the `ResourceBuilder`
rebuilds clusters and assignments from the endpoint index, the
`SecretGenerator` serializes new certificates; the cache says which names
really changed. Fan-out then marks those names on exactly the streams that
watch them (`SubscriberIndex`): shared names on their subscribers, a proxy's
own secrets on that proxy's streams only, and wakes their writers.

Streams tell the pipeline what they subscribe to (`join`, `on_events`,
`leave`); the first stream of a proxy to name a secret has the generator start
keeping it, the last to let go has it dropped. Streams read one consistent
state through `view`. Nothing here touches gRPC.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Protocol

from pilot.generators.builder import BuildSettings, ResourceBuilder
from pilot.generators.sds import CertificateSource, SecretGenerator
from pilot.protocol.kind import StreamKind
from pilot.protocol.messages import StreamEvent, SubscriptionChanged
from pilot.protocol.node import streams_to_wake
from pilot.protocol.stream import StreamCore
from pilot.push.debounce import Debouncer
from pilot.push.request import PushRequest
from pilot.push.settings import DebounceSettings, PushSettings
from pilot.push.subscribers import SubscriberIndex
from pilot.registry.index import EndpointIndex
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ProxyView, ResourceCache
from pilot.xds.proxy import ProxyKey

log = logging.getLogger("pilot.push")


class Subscriber(Protocol):
    """A stream, as the pipeline drives it (the gRPC shell's connection)."""

    @property
    def proxy(self) -> ProxyKey: ...

    @property
    def kind(self) -> StreamKind: ...

    @property
    def stream(self) -> StreamCore: ...

    def notify(self, type_url: str, names: Iterable[str], started: float) -> bool:
        """Mark changed names; True if the stream cares (and was woken)."""
        ...

    def wake(self) -> None:
        """The stream's machine has work marked: let its writer run."""
        ...


class PipelineMetrics(Protocol):
    """What the pipeline reports as it runs."""

    def debounced(self, seconds: float) -> None: ...


class _NoMetrics:
    def debounced(self, seconds: float) -> None:
        pass


class Pipeline:
    """Owns debounce, build, cache and fan-out; streams and sources only submit and read."""

    def __init__(
        self,
        cache: ResourceCache,
        stats: XdsStats,
        *,
        index: EndpointIndex | None = None,
        build: BuildSettings | None = None,
        certificates: CertificateSource | None = None,
        debounce: DebounceSettings | None = None,
        push: PushSettings | None = None,
        metrics: PipelineMetrics | None = None,
    ) -> None:
        self.cache = cache
        self.settings = push or PushSettings()
        # Bounds the responses being built and written at once, across all streams.
        self.push_slots = asyncio.Semaphore(self.settings.throttle)
        # Set once the first full state is built: streams answer nothing before.
        self.ready = asyncio.Event()
        self._stats = stats
        self._metrics = metrics or _NoMetrics()
        self._debouncer = Debouncer(debounce or DebounceSettings())
        self._subscribers: SubscriberIndex[Subscriber] = SubscriberIndex()
        self._registry = (
            ResourceBuilder(index, cache, build or BuildSettings(), stats) if index else None
        )
        self._secrets = (
            SecretGenerator(certificates, cache, stats, self._certificate_ready)
            if certificates is not None
            else None
        )

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

    def _certificate_ready(self, proxy: ProxyKey) -> None:
        self.submit(PushRequest(certificates=frozenset((proxy,))))

    # -- build and fan-out -------------------------------------------------------

    def _flush(self, request: PushRequest, started: float) -> None:
        self._metrics.debounced(time.monotonic() - started)
        shared: dict[str, set[str]] = {}
        owned: dict[ProxyKey, set[str]] = {}
        if request.registry and self._registry is not None:
            shared.update(self._registry.apply(request.registry))
        if request.certificates and self._secrets is not None:
            root, owned = self._secrets.build(request.certificates)
            if root:
                shared[types.SECRET] = root
        if shared or owned:
            woken = self._fan_out(shared, owned, started)
            counts = {types.short_name(t): len(n) for t, n in shared.items()}
            log.debug("push %s and %d proxies' secrets to %d streams", counts, len(owned), woken)

    def _fan_out(
        self,
        shared: Mapping[str, set[str]],
        owned: Mapping[ProxyKey, set[str]],
        started: float,
    ) -> int:
        """Mark changed names on the streams that watch them; returns streams woken."""
        woken: set[Subscriber] = set()
        for type_url in sorted(shared, key=types.push_rank):
            names = shared[type_url]
            for subscriber in self._subscribers.watchers(type_url, names):
                if subscriber.notify(type_url, names, started):
                    woken.add(subscriber)
        for proxy, names in owned.items():
            for subscriber in self._subscribers.streams_of(proxy):
                if subscriber.notify(types.SECRET, names, started):
                    woken.add(subscriber)
        self._stats.pushes += 1
        self._stats.streams_woken += len(woken)
        return len(woken)

    # -- streams -------------------------------------------------------------------

    def view(self, subscriber: Subscriber) -> ProxyView:
        """What this stream may read: its flavor of the shared resources, and its own."""
        return self.cache.view(subscriber.kind.flavor.value, subscriber.proxy)

    def join(self, subscriber: Subscriber) -> None:
        """A stream identified its proxy (on its first request)."""
        self._subscribers.join(subscriber)

    def on_events(self, subscriber: Subscriber, events: Iterable[StreamEvent]) -> None:
        """What a request meant: subscription changes, and replies other streams follow."""
        siblings = self._subscribers.streams_of(subscriber.proxy)
        for event in events:
            if isinstance(event, SubscriptionChanged):
                self._subscribers.apply(subscriber, event)
                self._watch_owned(subscriber.proxy, event.type_url, event.added, first=True)
                self._watch_owned(subscriber.proxy, event.type_url, event.removed, first=False)
            for sibling in streams_to_wake(subscriber, event, siblings):
                sibling.wake()

    def leave(self, subscriber: Subscriber) -> None:
        """A stream ended: forget its subscriptions; its proxy may let go of secrets."""
        subscriptions = subscriber.stream.subscriptions()
        self._subscribers.leave(subscriber, subscriptions)
        for type_url, names in subscriptions:
            self._watch_owned(subscriber.proxy, type_url, names, first=False)

    def _watch_owned(
        self, proxy: ProxyKey, type_url: str, names: Iterable[str], *, first: bool
    ) -> None:
        """Tell the generator when a proxy starts (first stream) or stops (last) naming a secret."""
        if type_url != types.SECRET or self._secrets is None:
            return
        for name in names:
            watchers = self._subscribers.proxy_watchers(proxy, type_url, name)
            if first and watchers == 1:
                self._secrets.watch(proxy, name)
            elif not first and watchers == 0:
                self._secrets.unwatch(proxy, name)
