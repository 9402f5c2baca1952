"""The send timeout's one timer: the writes that outlive it end, in order; no other does.

`WriteDeadlines` replaced a timer per write. What a stream would notice if it were
wrong: a stream whose write is stuck never ended (its client holds pilot's memory),
or a stream whose writes land in time ended anyway.
"""

from __future__ import annotations

import asyncio

from pilot.push.deadlines import WriteDeadlines

TIMEOUT = 0.05
WAIT = 5.0


async def test_a_stuck_write_times_out_and_a_landed_one_does_not() -> None:
    deadlines = WriteDeadlines(TIMEOUT)
    timed_out: list[str] = []
    stuck = asyncio.Event()

    def on_stuck() -> None:
        timed_out.append("stuck")
        stuck.set()

    deadlines.started("landed", lambda: timed_out.append("landed"))
    deadlines.started("stuck", on_stuck)
    deadlines.ended("landed")  # its write landed before the timeout
    async with asyncio.timeout(WAIT):
        await stuck.wait()
    assert timed_out == ["stuck"]
    assert len(deadlines) == 0, "a timed-out write is let go of"


async def test_the_timer_waits_for_the_oldest_write_still_in_flight() -> None:
    """The first write lands; the timer, due at its deadline, must wait on for the second's,
    however many writes came and went meanwhile."""
    deadlines = WriteDeadlines(TIMEOUT)
    loop = asyncio.get_running_loop()
    ended_at: dict[str, float] = {}
    done = asyncio.Event()

    def timed_out(name: str) -> None:
        ended_at[name] = loop.time()
        if len(ended_at) == 2:
            done.set()

    deadlines.started("first", lambda: timed_out("first"))
    deadlines.ended("first")
    await asyncio.sleep(TIMEOUT / 2)  # the second write starts later than the first
    second_started = loop.time()
    deadlines.started("second", lambda: timed_out("second"))
    for i in range(100):  # writes that land in time: none of them times out
        deadlines.started(f"quick-{i}", lambda: timed_out("a quick write"))
        deadlines.ended(f"quick-{i}")
    third_started = loop.time()
    deadlines.started("third", lambda: timed_out("third"))
    async with asyncio.timeout(WAIT):
        await done.wait()
    assert sorted(ended_at) == ["second", "third"]
    assert ended_at["second"] >= second_started + TIMEOUT, "timed out before its deadline"
    assert ended_at["third"] >= third_started + TIMEOUT, "timed out before its deadline"
    assert ended_at["second"] <= ended_at["third"]


async def test_a_writer_that_writes_again_gets_a_new_deadline() -> None:
    """A stream writes one response after another: each write's deadline counts from its
    own start, and a writer is timed out once, for its write in flight."""
    deadlines = WriteDeadlines(TIMEOUT)
    loop = asyncio.get_running_loop()
    calls: list[float] = []
    fired = asyncio.Event()

    def on_timeout() -> None:
        calls.append(loop.time())
        fired.set()

    deadlines.started("stream", on_timeout)
    deadlines.ended("stream")
    deadlines.started("other", lambda: None)  # in flight before the stream's next write
    await asyncio.sleep(TIMEOUT / 2)
    again = loop.time()
    deadlines.started("stream", on_timeout)
    async with asyncio.timeout(WAIT):
        await fired.wait()
    assert len(calls) == 1
    assert calls[0] >= again + TIMEOUT, "the deadline of the earlier write was used"
