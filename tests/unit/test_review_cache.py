"""Streams waiting on one TokenReview are not cancelled with the stream that asked it.

Concurrent reviews of one token share one request to the API server, made by
the first caller. When that caller goes away (its client cancelled), the others
must still get their answer; once they got its CancelledError instead and their
streams ended without a status.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from pilot.limits import LimitHits
from pilot.security.review_cache import CachedReviewer
from tests.support.deadline import bounded


class _SlowReviewer:
    """Answers every token with one user name, once `release` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.calls = 0

    async def review(self, token: str, audiences: Sequence[str]) -> str:
        self.calls += 1
        await self.release.wait()
        return "system:serviceaccount:ns-b:victim"


async def test_the_others_get_their_answer_when_the_first_caller_goes_away() -> None:
    api = _SlowReviewer()
    cache = CachedReviewer(api, size=10, hits=LimitHits())
    first = asyncio.create_task(cache.review("token", ["pilot"]))
    await asyncio.sleep(0)  # the first caller is asking the API server
    second = asyncio.create_task(cache.review("token", ["pilot"]))
    await asyncio.sleep(0)  # the second waits on the same request
    assert api.calls == 1

    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    api.release.set()
    assert await bounded(second, 5) == "system:serviceaccount:ns-b:victim"
    assert api.calls == 2, "the second caller asked again"


async def test_a_waiting_caller_cancelled_is_cancelled_alone() -> None:
    api = _SlowReviewer()
    cache = CachedReviewer(api, size=10, hits=LimitHits())
    first = asyncio.create_task(cache.review("token", ["pilot"]))
    await asyncio.sleep(0)
    second = asyncio.create_task(cache.review("token", ["pilot"]))
    await asyncio.sleep(0)

    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    api.release.set()
    assert await bounded(first, 5) == "system:serviceaccount:ns-b:victim"
    assert api.calls == 1
