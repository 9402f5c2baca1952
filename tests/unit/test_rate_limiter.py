"""PILOT_MAX_REQUESTS_PER_SECOND's bucket: who is admitted, when, and what a flood costs.

The clock is the test's, and `asyncio.sleep` as pilot.limits calls it records each
delay and gives one turn of the loop, so the bucket's arithmetic is checked without
waiting.
"""

from __future__ import annotations

import asyncio

import pytest

from pilot import limits
from pilot.limits import LimitExceeded, RateLimiter

_turn = asyncio.sleep  # the real one, before the fixture replaces it


class Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.sleeps.append(delay)
        await _turn(0)  # a turn of the loop, as a real sleep would give


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(limits.asyncio, "sleep", clock.sleep)
    return clock


async def _outcome(limiter: RateLimiter) -> str:
    try:
        await limiter.admit()
    except LimitExceeded:
        return "refused"
    return "admitted"


async def test_a_burst_is_admitted_then_each_waits_its_own_turn_then_the_rest_is_refused(
    clock: Clock,
) -> None:
    limiter = RateLimiter(rate=10, wait=0.5, clock=clock)
    outcomes = await asyncio.gather(*(_outcome(limiter) for _ in range(20)))
    assert outcomes == ["admitted"] * 15 + ["refused"] * 5
    # The first 10 take the burst; the next 5 each sleep once, in order, a token apart.
    assert clock.sleeps == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])


async def test_a_flood_costs_one_timer_per_waiting_caller_not_a_wake_up_per_token(
    clock: Clock,
) -> None:
    limiter = RateLimiter(rate=1000, wait=1.0, clock=clock)
    outcomes = await asyncio.gather(*(_outcome(limiter) for _ in range(5000)))
    assert outcomes.count("admitted") == 2000  # the burst, then a second's worth
    assert len(clock.sleeps) == 1000


async def test_a_caller_that_leaves_before_its_turn_gives_it_back(
    clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    limiter = RateLimiter(rate=10, wait=1.0, clock=clock)
    await asyncio.gather(*(limiter.admit() for _ in range(10)))  # the burst is spent
    blocked = asyncio.Event()

    async def never_woken(delay: float) -> None:
        clock.sleeps.append(delay)
        blocked.set()
        await asyncio.Event().wait()

    monkeypatch.setattr(limits.asyncio, "sleep", never_woken)
    leaving = asyncio.create_task(limiter.admit())
    await blocked.wait()
    leaving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await leaving
    monkeypatch.setattr(limits.asyncio, "sleep", clock.sleep)
    await limiter.admit()
    assert clock.sleeps == pytest.approx([0.1, 0.1]), "the next caller waited behind a ghost"


async def test_the_bucket_refills_with_time_up_to_its_burst(clock: Clock) -> None:
    limiter = RateLimiter(rate=10, wait=0.0, clock=clock)
    assert [await _outcome(limiter) for _ in range(11)] == ["admitted"] * 10 + ["refused"]
    clock.now += 0.35  # three tokens and a half
    assert [await _outcome(limiter) for _ in range(4)] == ["admitted"] * 3 + ["refused"]
    clock.now += 3600
    assert [await _outcome(limiter) for _ in range(11)] == ["admitted"] * 10 + ["refused"]


async def test_rate_zero_admits_everyone(clock: Clock) -> None:
    limiter = RateLimiter(rate=0, clock=clock)
    assert await asyncio.gather(*(_outcome(limiter) for _ in range(100))) == ["admitted"] * 100
