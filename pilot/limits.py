"""Bounds on what one caller can make pilot hold or do, and what happens when one is hit.

Every limit has a default, an environment variable (`limits_from_env`), a
metric (`pilot_limit_hits_total{limit=...}`) and a log line when hit. A flood
must not become a flood of log lines: each limit logs at most one line every
`LOG_EVERY` seconds, saying how many more were refused meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

log = logging.getLogger("pilot.limits")

LOG_EVERY = 10.0


class LimitExceeded(Exception):
    """A caller went past one of pilot's bounds (RESOURCE_EXHAUSTED); the message says which."""

    def __init__(self, limit: str, message: str) -> None:
        super().__init__(message)
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds, with their defaults; each field has an environment variable (`ENV`)."""

    resource_names: int = 10_000  # names one stream subscribes to, per type
    streams: int = 20_000  # xDS streams in all
    streams_per_connection: int = 1_000  # xDS streams on one HTTP/2 connection
    request_bytes: int = 1024 * 1024  # one request message (10,000 names of 100 bytes)
    node_bytes: int = 64 * 1024  # a stream's node (id, metadata, ...), kept while it lives
    requests_per_second: float = 1000.0  # new streams and calls per second (0: no limit)
    certificates_per_identity: int = 1_000  # live workload keys of one identity
    certificates: int = 50_000  # live workload keys in all
    pending_csrs: int = 1_000  # CreateCertificate calls being answered at once
    token_cache: int = 10_000  # TokenReview answers remembered


ENV = {
    "resource_names": "PILOT_MAX_RESOURCE_NAMES",
    "streams": "PILOT_MAX_STREAMS",
    "streams_per_connection": "PILOT_MAX_STREAMS_PER_CONNECTION",
    "request_bytes": "PILOT_MAX_REQUEST_BYTES",
    "node_bytes": "PILOT_MAX_NODE_BYTES",
    "requests_per_second": "PILOT_MAX_REQUESTS_PER_SECOND",
    "certificates_per_identity": "PILOT_MAX_CERTIFICATES_PER_IDENTITY",
    "certificates": "PILOT_MAX_CERTIFICATES",
    "pending_csrs": "PILOT_MAX_PENDING_CSRS",
    "token_cache": "PILOT_TOKEN_CACHE_SIZE",
}


class LimitSettingError(ValueError):
    """A limit's environment variable has a value pilot cannot use."""


def limits_from_env(env: Mapping[str, str] | None = None) -> Limits:
    """Each PILOT_MAX_* (and PILOT_TOKEN_CACHE_SIZE) that is set; the defaults for the rest."""
    env = os.environ if env is None else env
    values: dict[str, float | int] = {}
    for field in fields(Limits):
        name = ENV[field.name]
        raw = env.get(name)
        if raw is None:
            continue
        try:
            value = float(raw) if field.type == "float" else int(raw)
        except ValueError:
            raise LimitSettingError(f"{name}: expected a number, got {raw!r}") from None
        if value < 0 or (value == 0 and field.name != "requests_per_second"):
            raise LimitSettingError(f"{name}: must be positive, got {raw!r}")
        values[field.name] = value
    return Limits(**values)  # type: ignore[arg-type]


class LimitHits:
    """Counts every refusal by limit (for /metrics) and logs them, a line at most per period."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.counts: Counter[str] = Counter()
        self._clock = clock
        self._logged_at: dict[str, float] = {}
        self._quiet: Counter[str] = Counter()

    def hit(self, error: LimitExceeded, who: str, count: int = 1) -> None:
        """Count `count` refusals (one line says them all); log unless this limit logged
        less than LOG_EVERY ago."""
        self.counts[error.limit] += count
        now = self._clock()
        last = self._logged_at.get(error.limit)
        if last is not None and now - last < LOG_EVERY:
            self._quiet[error.limit] += count
            return
        suppressed = self._quiet.pop(error.limit, 0)
        more = f" ({suppressed} more refused since the last such line)" if suppressed else ""
        log.warning("limit %s: refused %s: %s%s", error.limit, who, error, more)
        self._logged_at[error.limit] = now


class RateLimiter:
    """A token bucket: `rate` admissions per second, bursts of up to `rate`.

    As Istio's PILOT_MAX_REQUESTS_PER_SECOND: a caller waits up to `wait`
    seconds for its turn, then is refused (Envoy retries with backoff, often at
    another replica). A caller that must wait reserves its turn, as Go's
    `rate.Limiter.Wait` does: the bucket goes into debt by one token, and the
    caller sleeps once, until that token exists. Callers are admitted in the
    order they came, and a thousand waiting callers cost a thousand timers, not
    a thousand wake-ups per token.
    """

    def __init__(
        self, rate: float, wait: float = 1.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._rate = rate
        self._wait = wait
        self._clock = clock
        self._tokens = rate  # below 0: the turns reserved by callers still waiting
        self._updated = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self._rate, self._tokens + (now - self._updated) * self._rate)
        self._updated = now

    async def admit(self) -> None:
        """Take a token, waiting for one at most `wait`; raises LimitExceeded."""
        if self._rate <= 0:
            return
        self._refill()
        self._tokens -= 1
        if self._tokens >= 0:
            return
        delay = -self._tokens / self._rate  # until the token this caller reserved exists
        if delay > self._wait:
            self._tokens += 1  # refused: its turn goes back to the bucket
            raise LimitExceeded(
                "requests_per_second",
                f"more than {self._rate:g} new streams and calls per second"
                " (PILOT_MAX_REQUESTS_PER_SECOND); retry later",
            )
        try:
            await asyncio.sleep(delay)
        except asyncio.CancelledError:
            self._tokens += 1  # a caller gone before its turn gives it back
            raise


@dataclass
class Admission:
    """What one pilot enforces on its callers: the limits, their counters, the rate."""

    limits: Limits
    hits: LimitHits
    rate: RateLimiter

    @classmethod
    def of(cls, limits: Limits) -> Admission:
        return cls(limits, LimitHits(), RateLimiter(limits.requests_per_second))

    @classmethod
    def unlimited(cls) -> Admission:
        """Defaults for the bounds, no rate limit: for embedding (tests, `pilot agent`)."""
        return cls(Limits(), LimitHits(), RateLimiter(0))
