"""The debounce stage: registry changes merged per window, certificates sent at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pilot.push.debounce import Debouncer
from pilot.push.request import PushRequest
from pilot.push.settings import DebounceSettings
from pilot.registry.index import IndexChange
from pilot.registry.model import ServiceKey
from pilot.xds.proxy import ProxyKey

DEADLINE = 5.0


def _endpoints(name: str) -> PushRequest:
    return PushRequest(registry=IndexChange(endpoints=frozenset({ServiceKey("ns", name)})))


def _full(name: str) -> PushRequest:
    return PushRequest(registry=IndexChange(full=frozenset({ServiceKey("ns", name)})))


def _certificate(node: str) -> PushRequest:
    return PushRequest(certificates=frozenset({ProxyKey(node, "spiffe://td/ns/a/sa/b")}))


class Flushes:
    """What the debouncer flushed, and how long each had waited."""

    def __init__(self) -> None:
        self.seen: list[tuple[PushRequest, float]] = []
        self._arrived = asyncio.Condition()

    def __call__(self, request: PushRequest, since: float) -> None:
        self.seen.append((request, time.monotonic() - since))
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._arrived:
            self._arrived.notify_all()

    async def wait_for(self, count: int) -> list[tuple[PushRequest, float]]:
        async with self._arrived:
            await asyncio.wait_for(
                self._arrived.wait_for(lambda: len(self.seen) >= count), DEADLINE
            )
        return self.seen


@asynccontextmanager
async def running(settings: DebounceSettings) -> AsyncIterator[tuple[Debouncer, Flushes]]:
    debouncer = Debouncer(settings)
    flushes = Flushes()
    task = asyncio.create_task(debouncer.run(flushes))
    try:
        yield debouncer, flushes
    finally:
        task.cancel()


async def test_a_burst_inside_the_window_is_one_merged_push() -> None:
    async with running(DebounceSettings(after=0.2, max_delay=5)) as (debouncer, flushes):
        for i in range(1000):
            debouncer.submit(_endpoints(f"svc-{i % 10}"))
            if i % 100 == 0:
                await asyncio.sleep(0)  # let the debouncer see the window filling
        [(request, _)] = await flushes.wait_for(1)
        assert not debouncer.take()[0], "nothing left over for a second push"
    assert len(request.registry.endpoints) == 10


async def test_endpoint_changes_skip_the_wait_when_eds_debounce_is_off() -> None:
    settings = DebounceSettings(after=30, max_delay=60, eds_debounce=False)
    async with running(settings) as (debouncer, flushes):
        debouncer.submit(_endpoints("a"))
        [(_, waited)] = await flushes.wait_for(1)
    assert waited < DEADLINE, "flushed without waiting for the 30s quiet period"


async def test_a_window_never_stays_open_longer_than_max() -> None:
    settings = DebounceSettings(after=30, max_delay=0.1, eds_debounce=False)
    async with running(settings) as (debouncer, flushes):
        debouncer.submit(_full("a"))
        [(request, waited)] = await flushes.wait_for(1)
    assert request.registry.full == {ServiceKey("ns", "a")}
    assert waited < DEADLINE, "flushed at PILOT_DEBOUNCE_MAX, not after the 30s quiet period"


async def test_a_certificate_goes_at_once_and_leaves_the_open_window_open() -> None:
    settings = DebounceSettings(after=30, max_delay=60)
    async with running(settings) as (debouncer, flushes):
        debouncer.submit(_full("a"))
        debouncer.submit(_certificate("node-1"))
        [(request, waited)] = await flushes.wait_for(1)
        assert request.certificates == {ProxyKey("node-1", "spiffe://td/ns/a/sa/b")}
        assert not request.registry, "the registry window waits for its quiet period"
        assert waited < DEADLINE
        debouncer.submit(_certificate("node-2"))
        [_, (second, _)] = await flushes.wait_for(2)
    assert {p.node_id for p in second.certificates} == {"node-2"}
    assert not second.registry


async def test_take_returns_everything_pending_at_once() -> None:
    debouncer = Debouncer(DebounceSettings(after=30, max_delay=60))
    debouncer.submit(_full("a"))
    debouncer.submit(_endpoints("b"))
    debouncer.submit(_certificate("node-1"))
    request, _ = debouncer.take()
    assert request.registry.full == {ServiceKey("ns", "a")}
    assert request.registry.endpoints == {ServiceKey("ns", "b")}
    assert len(request.certificates) == 1
    assert not debouncer.take()[0]
