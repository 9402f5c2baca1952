"""What the webhook counts (Istio's `sidecar_injection_*` metrics) and how it tells of a
request it refused: one warning line per kind of refusal every LOG_EVERY seconds at most,
saying how many more came meanwhile, with whatever the caller chose (a path, a content
type, a reason) escaped and cut short (`pilot.logs.clipped`)."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from pilot.logs import clipped

log = logging.getLogger("pilot.webhook")

LOG_EVERY = 10.0

# The kinds of refusal, the label values of pilot_injection_refusals_total.
NOT_FOUND = "not_found"  # a path other than /inject
METHOD = "method"  # a method other than POST
TOO_LARGE = "too_large"  # a body over 6 MiB (400, as Istio)
EMPTY = "empty"  # no body (400)
SLOW = "slow_body"  # the body did not arrive within PILOT_INJECTION_BODY_TIMEOUT
ABORTED = "aborted"  # the caller closed the connection (or broke its framing) mid-body
MALFORMED = "malformed"  # not HTTP/1.1 aiohttp could parse (after the TLS handshake)
BUSY = "busy"  # past PILOT_MAX_INJECTION_REVIEWS or PILOT_MAX_INJECTION_BYTES (429)
CONTENT_TYPE = "content_type"  # not JSON (415)
UNDECODABLE = "undecodable"  # not an AdmissionReview (400)
TEMPLATE = "template"  # the Pod cannot be injected: allowed false, with the message
INTERNAL = "internal"  # pilot's own fault (500); logged every time it happens
KINDS = (
    NOT_FOUND,
    METHOD,
    TOO_LARGE,
    EMPTY,
    SLOW,
    ABORTED,
    MALFORMED,
    BUSY,
    CONTENT_TYPE,
    UNDECODABLE,
    TEMPLATE,
    INTERNAL,
)


@dataclass
class InjectionStats:
    """Istio's counters, and pilot's refusals by kind."""

    requests: int = 0  # sidecar_injection_requests_total: every POST /inject
    success: int = 0  # sidecar_injection_success_total: answered, the Pod allowed
    skip: int = 0  # sidecar_injection_skip_total: allowed without a patch (not injected)
    failure: int = 0  # sidecar_injection_failure_total: refused, or the Pod refused
    refusals: Counter[str] = field(default_factory=Counter)


class Refusals:
    """Counts each refusal and logs it, a line per kind per LOG_EVERY seconds at most."""

    def __init__(self, stats: InjectionStats, clock: Callable[[], float] = time.monotonic):
        self._stats = stats
        self._clock = clock
        self._logged_at: dict[str, float] = {}
        self._quiet: Counter[str] = Counter()

    def refused(self, kind: str, who: str, reason: str) -> None:
        """Count a refusal of `kind` of a request from `who` (an address) for `reason` (the
        caller's words may be in it: it is clipped here)."""
        self._stats.refusals[kind] += 1
        now = self._clock()
        last = self._logged_at.get(kind)
        if kind != INTERNAL and last is not None and now - last < LOG_EVERY:
            self._quiet[kind] += 1
            return
        quiet = self._quiet.pop(kind, 0)
        more = f" ({quiet} more since the last such line)" if quiet else ""
        log.warning(
            "injection webhook refused a request from %s: %s%s", who, clipped(reason, 300), more
        )
        self._logged_at[kind] = now


class ParserLines(logging.Filter):
    """For the logger aiohttp's HTTP protocol is given: its "Error handling request" (a
    traceback for every malformed request a caller sends) becomes one refusal of kind
    MALFORMED, counted and logged as the others; nothing of aiohttp's own is emitted."""

    def __init__(self, refusals: Refusals) -> None:
        super().__init__()
        self._refusals = refusals

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        what = f"{type(error).__name__}: {str(error).strip()}" if error else record.getMessage()
        self._refusals.refused(MALFORMED, "a caller", f"{record.getMessage()}: {what}")
        return False


def parser_logger(refusals: Refusals) -> logging.Logger:
    """A logger of the webhook's own (no parent, no handler) that passes aiohttp's lines
    to `refusals` only."""
    logger = logging.Logger("pilot.webhook.http")
    logger.addFilter(ParserLines(refusals))
    return logger
