"""TokenReview answers, remembered briefly, so a flood of tokens is not a flood at the API server.

A `TokenReviewer` in front of another: the answer for a token (a user name, or
the refusal) is kept for a short time, positive answers longer than negative
ones; concurrent reviews of one token share one request to the API server;
the cache holds at most `size` answers (PILOT_TOKEN_CACHE_SIZE), the oldest
forgotten first. Tokens are kept only as their SHA-256 digest.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pilot.limits import LimitExceeded, LimitHits
from pilot.security.authn import AuthError, TokenReviewer

POSITIVE_TTL = 60.0  # a valid token stays valid for at least this long (they live an hour)
NEGATIVE_TTL = 5.0  # a refused token may be about to become valid (clock skew, a new SA)


@dataclass(frozen=True, slots=True)
class _Answer:
    expires: float
    username: str | None
    refusal: str | None


class CachedReviewer:
    """Implements `TokenReviewer` by asking `reviewer` only when it has no fresh answer."""

    def __init__(
        self,
        reviewer: TokenReviewer,
        size: int,
        hits: LimitHits,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._reviewer = reviewer
        self._size = size
        self._hits = hits
        self._clock = clock
        self._answers: OrderedDict[bytes, _Answer] = OrderedDict()
        self._in_flight: dict[bytes, asyncio.Future[_Answer]] = {}
        self.reviews = 0  # requests that reached the API server
        self.cached = 0  # answers given from the cache

    async def review(self, token: str, audiences: Sequence[str]) -> str:
        key = hashlib.sha256("\0".join((token, *audiences)).encode()).digest()
        answer = self._fresh(key)
        if answer is None:
            answer = await self._ask(key, token, audiences)
        else:
            self.cached += 1
        if answer.refusal is not None:
            raise AuthError(answer.refusal)
        assert answer.username is not None
        return answer.username

    def _fresh(self, key: bytes) -> _Answer | None:
        answer = self._answers.get(key)
        if answer is None or answer.expires <= self._clock():
            return None
        return answer

    async def _ask(self, key: bytes, token: str, audiences: Sequence[str]) -> _Answer:
        pending = self._in_flight.get(key)
        if pending is not None:
            self.cached += 1
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not pending.cancelled() or (task is not None and task.cancelling()):
                    raise  # this caller was cancelled
                # The caller that asked the API server went away: its cancellation is
                # not this caller's, who asks again.
                return await self._ask(key, token, audiences)
        future: asyncio.Future[_Answer] = asyncio.get_running_loop().create_future()
        self._in_flight[key] = future
        try:
            answer = await self._review(token, audiences)
        except asyncio.CancelledError:
            future.cancel()
            raise
        except BaseException as error:
            future.set_exception(error)
            future.exception()  # retrieved here: no "never retrieved" warning if nobody waits
            raise
        else:
            future.set_result(answer)
        finally:
            del self._in_flight[key]
        self._remember(key, answer)
        return answer

    async def _review(self, token: str, audiences: Sequence[str]) -> _Answer:
        self.reviews += 1
        try:
            username = await self._reviewer.review(token, audiences)
        except AuthError as error:
            return _Answer(self._clock() + NEGATIVE_TTL, None, str(error))
        return _Answer(self._clock() + POSITIVE_TTL, username, None)

    def _remember(self, key: bytes, answer: _Answer) -> None:
        self._answers[key] = answer
        self._answers.move_to_end(key)
        while len(self._answers) > self._size:
            self._answers.popitem(last=False)
            self._hits.hit(
                LimitExceeded(
                    "token_cache",
                    f"more than {self._size} recent tokens (PILOT_TOKEN_CACHE_SIZE):"
                    " forgetting the oldest answer",
                ),
                "TokenReview cache",
            )
