"""`ThreadBatches`: calls run off the loop in batches, each caller getting its own outcome.

- A burst costs one thread hand-off per batch, not one per call, and never runs
  on the event loop's thread.
- A lane of one thread never runs two calls at once (EC crypto holds the GIL: a
  second thread would only take turns with the first, and with the loop).
- A call that raises fails alone; a caller that gave up is skipped before its
  batch runs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from pilot.security import batches
from pilot.security.batches import ThreadBatches


@pytest.fixture
def hand_offs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of each batch handed to a thread."""
    sizes: list[int] = []
    to_thread = asyncio.to_thread

    async def counted(function: Callable[..., Any], batch: list[Any]) -> Any:
        sizes.append(len(batch))
        return await to_thread(function, batch)

    monkeypatch.setattr(batches.asyncio, "to_thread", counted)
    return sizes


async def test_a_burst_is_handed_off_in_batches_off_the_loop(hand_offs: list[int]) -> None:
    lane = ThreadBatches(asyncio.Semaphore(2), batch=16, threads=1, name="test")
    ran_on: list[int] = []

    def work(value: int) -> int:
        ran_on.append(threading.get_ident())
        return value * value

    results = await asyncio.gather(*(lane.run(lambda v=v: work(v)) for v in range(40)))
    assert results == [v * v for v in range(40)]
    assert sum(hand_offs) == 40 and len(hand_offs) == 3, hand_offs
    assert threading.get_ident() not in ran_on, "a call ran on the event loop's thread"


async def test_a_lane_of_one_thread_runs_one_call_at_a_time() -> None:
    lane = ThreadBatches(asyncio.Semaphore(4), batch=2, threads=1, name="test")
    running, most = [0], [0]
    guard = threading.Lock()

    def work() -> None:
        with guard:
            running[0] += 1
            most[0] = max(most[0], running[0])
        threading.Event().wait(0.001)  # a slice of crypto, long enough to overlap
        with guard:
            running[0] -= 1

    await asyncio.gather(*(lane.run(work) for _ in range(20)))
    assert most[0] == 1


async def test_a_call_that_raises_fails_alone() -> None:
    lane = ThreadBatches(asyncio.Semaphore(1), batch=16, threads=1, name="test")

    def work(value: int) -> int:
        if value == 3:
            raise ValueError("this one's CSR does not verify")
        return value

    outcomes = await asyncio.gather(
        *(lane.run(lambda v=v: work(v)) for v in range(6)), return_exceptions=True
    )
    assert [o for i, o in enumerate(outcomes) if i != 3] == [0, 1, 2, 4, 5]
    assert isinstance(outcomes[3], ValueError)


async def test_a_caller_that_gave_up_is_skipped() -> None:
    slots = asyncio.Semaphore(1)
    lane = ThreadBatches(slots, batch=16, threads=1, name="test")
    ran: list[str] = []
    async with slots:  # the lane waits for a slot: both calls queue
        gone = asyncio.create_task(lane.run(lambda: ran.append("gone")))
        kept = asyncio.create_task(lane.run(lambda: ran.append("kept")))
        await asyncio.sleep(0)  # both queued
        gone.cancel()
    await kept
    assert ran == ["kept"]
    with pytest.raises(asyncio.CancelledError):
        await gone
