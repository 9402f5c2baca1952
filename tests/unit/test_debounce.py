"""The debounce stage, on a virtual clock: when each flush happens and what it merges.

Each test runs the real `Debouncer` on a `VirtualTimeLoop` (tests/support/virtual_time.py)
and gives it the loop's clock, so that its deadlines and its waits read one time.
Changes are submitted at set moments of that clock; `asyncio.sleep` moves the clock
to the next moment (instantly, and only after every task due before it has run), so
a test states exactly at which loop time each flush must happen: PILOT_DEBOUNCE_AFTER
is `after`, PILOT_DEBOUNCE_MAX is `max_delay`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

from pilot.push.debounce import Debouncer
from pilot.push.request import PushRequest
from pilot.push.settings import DebounceSettings
from pilot.registry.index import IndexChange
from pilot.registry.model import ServiceKey
from pilot.xds.proxy import ProxyKey
from tests.support.virtual_time import run_in_virtual_time

# Virtual seconds after the last submission by which every flush must have happened.
SETTLE = 120.0


def _endpoints(name: str) -> PushRequest:
    return PushRequest(registry=IndexChange(endpoints=frozenset({ServiceKey("ns", name)})))


def _full(name: str) -> PushRequest:
    return PushRequest(registry=IndexChange(full=frozenset({ServiceKey("ns", name)})))


def _certificate(node: str) -> PushRequest:
    return PushRequest(certificates=frozenset({ProxyKey(node, "spiffe://td/ns/a/sa/b")}))


def _keys(*names: str) -> set[ServiceKey]:
    return {ServiceKey("ns", name) for name in names}


@dataclass(frozen=True)
class Flushed:
    """One flush: when (loop time), the first change's time it reported, what it carried."""

    at: float
    since: float
    request: PushRequest


class Flushes:
    """What the debouncer flushed, stamped with the loop's clock."""

    def __init__(self) -> None:
        self.seen: list[Flushed] = []

    def __call__(self, request: PushRequest, since: float) -> None:
        self.seen.append(Flushed(asyncio.get_running_loop().time(), since, request))


@asynccontextmanager
async def running(settings: DebounceSettings) -> AsyncIterator[tuple[Debouncer, Flushes]]:
    debouncer = Debouncer(settings, clock=asyncio.get_running_loop().time)
    flushes = Flushes()
    task = asyncio.create_task(debouncer.run(flushes))
    try:
        yield debouncer, flushes
    finally:
        task.cancel()


async def _until(moment: float) -> None:
    """Let the clock reach `moment` (everything due before it runs first)."""
    await asyncio.sleep(moment - asyncio.get_running_loop().time())


async def _submit_at(debouncer: Debouncer, schedule: Iterable[tuple[float, PushRequest]]) -> None:
    for moment, request in schedule:
        await _until(moment)
        debouncer.submit(request)


async def _flushes_of(
    settings: DebounceSettings, schedule: Sequence[tuple[float, PushRequest]]
) -> list[Flushed]:
    """Every flush of a debouncer fed `schedule`, once it has had time to flush it all."""
    async with running(settings) as (debouncer, flushes):
        await _submit_at(debouncer, schedule)
        await _until(schedule[-1][0] + SETTLE)
        assert not debouncer.take()[0], "nothing left over after the last flush"
    return flushes.seen


def _when(flushed: Sequence[Flushed]) -> list[tuple[float, float]]:
    """(when, since) of each flush, rounded off float noise from adding up moments."""
    return [(round(f.at, 6), round(f.since, 6)) for f in flushed]


def test_changes_closer_together_than_after_are_one_push() -> None:
    # 50 changes, one every 0.5 s, for 24.5 s: never 1 s of quiet until the last.
    settings = DebounceSettings(after=1.0, max_delay=100.0)
    schedule = [(i * 0.5, _endpoints(f"svc-{i % 10}")) for i in range(50)]
    flushes = run_in_virtual_time(_flushes_of(settings, schedule))
    assert _when(flushes) == [(24.5 + 1.0, 0.0)], "one push, 1 s after the last change"
    [flushed] = flushes
    assert flushed.request.registry.endpoints == _keys(*(f"svc-{i}" for i in range(10)))


def test_a_quiet_gap_longer_than_after_splits_the_pushes() -> None:
    settings = DebounceSettings(after=1.0, max_delay=100.0)
    schedule = [(0.0, _full("a")), (0.5, _endpoints("b")), (2.0, _full("c")), (2.5, _full("d"))]
    flushes = run_in_virtual_time(_flushes_of(settings, schedule))
    assert _when(flushes) == [(1.5, 0.0), (3.5, 2.0)], "a push 1 s after each burst"
    first, second = flushes
    assert first.request.registry.full == _keys("a")
    assert first.request.registry.endpoints == _keys("b")
    assert second.request.registry.full == _keys("c", "d")


def test_a_steady_trickle_is_pushed_every_max_delay() -> None:
    # A change every 0.4 s from 0.1 s to 9.7 s: never quiet for 1 s, so only
    # PILOT_DEBOUNCE_MAX (3 s after a window opens) closes a window, until the end.
    settings = DebounceSettings(after=1.0, max_delay=3.0)
    moments = [0.1 + 0.4 * i for i in range(25)]
    schedule = [(moment, _endpoints(f"svc-{i}")) for i, moment in enumerate(moments)]
    flushes = run_in_virtual_time(_flushes_of(settings, schedule))
    assert _when(flushes) == [(3.1, 0.1), (6.3, 3.3), (9.5, 6.5), (10.7, 9.7)]
    pushed = [sorted(int(k.name[4:]) for k in f.request.registry.endpoints) for f in flushes]
    assert pushed == [list(range(0, 8)), list(range(8, 16)), list(range(16, 24)), [24]]


def test_a_window_never_stays_open_longer_than_max() -> None:
    settings = DebounceSettings(after=30.0, max_delay=2.0)
    flushes = run_in_virtual_time(_flushes_of(settings, [(1.0, _full("a"))]))
    assert _when(flushes) == [(3.0, 1.0)], "pushed at PILOT_DEBOUNCE_MAX, not after 30 s"
    [flushed] = flushes
    assert flushed.request.registry.full == _keys("a")


def test_endpoint_changes_skip_the_wait_when_eds_debounce_is_off() -> None:
    settings = DebounceSettings(after=30.0, max_delay=60.0, eds_debounce=False)
    schedule = [(1.0, _endpoints("a")), (1.5, _endpoints("b"))]
    flushes = run_in_virtual_time(_flushes_of(settings, schedule))
    assert _when(flushes) == [(1.0, 1.0), (1.5, 1.5)], "each pushed when it arrived"
    first, second = flushes
    assert first.request.registry.endpoints == _keys("a")
    assert second.request.registry.endpoints == _keys("b")


def test_a_certificate_goes_at_once_and_leaves_the_open_window_open() -> None:
    settings = DebounceSettings(after=2.0, max_delay=60.0)
    schedule = [(0.0, _full("a")), (0.5, _certificate("node-1")), (1.0, _certificate("node-2"))]
    flushes = run_in_virtual_time(_flushes_of(settings, schedule))
    # Each certificate when it arrived; the window quiet since its only change at 0 s.
    assert _when(flushes) == [(0.5, 0.5), (1.0, 1.0), (2.0, 0.0)]
    node_1, node_2, window = flushes
    assert {p.node_id for p in node_1.request.certificates} == {"node-1"}
    assert {p.node_id for p in node_2.request.certificates} == {"node-2"}
    assert not node_1.request.registry and not node_2.request.registry
    assert window.request.registry.full == _keys("a") and not window.request.certificates


def test_take_returns_everything_pending_at_once() -> None:
    debouncer = Debouncer(DebounceSettings(after=30, max_delay=60))
    debouncer.submit(_full("a"))
    debouncer.submit(_endpoints("b"))
    debouncer.submit(_certificate("node-1"))
    request, _ = debouncer.take()
    assert request.registry.full == {ServiceKey("ns", "a")}
    assert request.registry.endpoints == {ServiceKey("ns", "b")}
    assert len(request.certificates) == 1
    assert not debouncer.take()[0]


def test_a_timer_that_fires_early_still_flushes() -> None:
    # pilot's debouncer reads time.monotonic; uvloop's timers read a millisecond clock and
    # may wake it a hair before its deadline. Here the loop's timer fires at 1.0 while the
    # debouncer's clock still reads 0.999 (it lags by 1 ms in that millisecond only): it
    # must wait out the rest and flush, not wait for another change (there is none).
    # Before, a file edit under uvloop was pushed only with the next change, one run in 9.
    async def lagging() -> list[Flushed]:
        loop = asyncio.get_running_loop()

        def clock() -> float:
            now = loop.time()
            return now - 0.001 if 1.0 <= now < 1.001 else now

        debouncer = Debouncer(DebounceSettings(after=1.0, max_delay=10.0), clock=clock)
        flushes = Flushes()
        task = asyncio.create_task(debouncer.run(flushes))
        try:
            debouncer.submit(_full("a"))
            await _until(SETTLE)
        finally:
            task.cancel()
        return flushes.seen

    flushes = run_in_virtual_time(lagging())
    assert [round(f.at, 3) for f in flushes] == [1.001], "flushed once the lag had passed"


def test_a_cancel_that_meets_a_change_still_ends_the_debouncer() -> None:
    # pilot stops its push task by cancelling it. A change arriving in the same turn of
    # the loop, while the window waits, must not undo that: asyncio.wait_for on Python
    # 3.11 swallows a cancellation whose inner wait has just finished, and the task
    # would run on, holding pilot's shutdown (SIGTERM ignored) for ever.
    async def cancelled_meeting_a_change() -> bool:
        clock = asyncio.get_running_loop().time
        debouncer = Debouncer(DebounceSettings(after=1.0, max_delay=10.0), clock=clock)
        task = asyncio.create_task(debouncer.run(Flushes()))
        debouncer.submit(_full("a"))
        await _until(0.5)  # the window is open, the task waits for quiet or a change
        debouncer.submit(_full("b"))  # wakes the task's wait ...
        await asyncio.sleep(0)  # ... whose inner wait finishes this turn
        task.cancel()  # and pilot stops the task in that same turn
        await asyncio.wait([task], timeout=SETTLE)
        return task.cancelled()

    assert run_in_virtual_time(cancelled_meeting_a_change()), "the debouncer ran on"
