"""Defects pilot has today, each found by the fuzzer and reproduced by one test.

Every `Defect` names what it `explains`: the violations it causes, matched narrowly
on status details and log text (a violation is judged with the rest of its example:
a stream left hanging is explained by the log line that says why, a stall by the
thousands of lines logged meanwhile). Defects
that would stall pilot for long also name the inputs the tests' random search must
`avoid`. `test_known_defects` reproduces each defect deterministically under
`xfail(strict=True)`: once it is fixed its test passes, the strict xfail fails the
suite, and whoever fixed it deletes the entry here (so that the search stops
tolerating or avoiding it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import grpc
import pytest

from tests.fuzz.calls import Call
from tests.fuzz.properties import LOGGED, LONG_LOG, SLOW_READY, STATUS, UNANSWERED, Violation
from tests.fuzz.strategies import CATASTROPHIC, HUGE_PATTERN, safe_regexes
from tests.security.pilot_process import Entry

NAMES_PER_CALL = 20_000  # more names than this in one call stall pilot's loop
SECRET_WARNING = "asked for secret"


class Seen(Protocol):
    """What a defect may look at to explain a violation: the whole example."""

    @property
    def call(self) -> Call: ...

    @property
    def entries(self) -> list[Entry]: ...

    @property
    def violations(self) -> list[Violation]: ...


Explains = Callable[[Violation, Seen], bool]


def _never(_call: Call) -> bool:
    return False


def _nothing(_violation: Violation, _seen: Seen) -> bool:
    return False


@dataclass(frozen=True)
class Defect:
    """A known defect: what it explains and which inputs must not be sent."""

    key: str
    summary: str
    explains: Explains = _nothing
    avoid: Callable[[Call], bool] = _never

    def xfail(self) -> pytest.MarkDecorator:
        reason = f"known defect {self.key}: {self.summary} (then delete it from known.py)"
        return pytest.mark.xfail(strict=True, reason=reason)


def _unexpected(exception: str, method: str = "") -> Explains:
    """An exception escaping a handler of a method under `method` (a path prefix):
    UNKNOWN, and gRPC's log lines and raw tracebacks about it."""

    def explains(violation: Violation, _seen: Seen) -> bool:
        if not violation.method.startswith(f"/{method}"):
            return False
        if violation.kind == STATUS:
            return violation.code is grpc.StatusCode.UNKNOWN and (
                f"Unexpected <class '{exception}'>" in violation.detail
            )
        return violation.kind == LOGGED and f"\n{exception}: " in violation.text

    return explains


_STUCK_STATUS = "GRPC_CALL_ERROR_TOO_MANY_OPERATIONS"


def _status_not_sent(violation: Violation, seen: Seen) -> bool:
    """gRPC's error for a status sent while a write is in flight, and the hanging call."""
    if violation.kind == LOGGED:
        return _STUCK_STATUS in violation.text
    return violation.kind == UNANSWERED and any(
        o.kind == LOGGED and _STUCK_STATUS in o.text for o in seen.violations
    )


def _logged(text: str) -> Explains:
    def explains(violation: Violation, _seen: Seen) -> bool:
        return violation.kind == LOGGED and text in violation.text

    return explains


def _long_log(violation: Violation, _seen: Seen) -> bool:
    return violation.kind == LONG_LOG


def _secret_warnings(violation: Violation, seen: Seen) -> bool:
    """A stall while pilot wrote a thousand secret warnings, or a megabyte of them."""
    if violation.kind != SLOW_READY:
        return False
    warned = [e for e in seen.entries if SECRET_WARNING in e["msg"]]
    return len(warned) >= 1000 or sum(int(e.get("size", 0)) for e in warned) >= 1 << 20


def _slow_regex(call: Call) -> bool:
    return any(p in CATASTROPHIC or len(p) >= HUGE_PATTERN for p in safe_regexes(call))


def names_in(call: Call) -> int:
    """How many resource names the call's requests carry in all."""
    total = 0
    for message in call.messages():
        for field in ("resource_names", "resource_names_subscribe", "resource_names_unsubscribe"):
            total += len(getattr(message, field, ()))
    return total


def _many_names(call: Call) -> bool:
    return names_in(call) > NAMES_PER_CALL


_DEFECTS = (
    Defect(
        "stream-status-not-sent",
        "when a stream is ended (INVALID_ARGUMENT, an exception, or PILOT_XDS_SEND_TIMEOUT"
        " for a client that stopped reading) while a response is still being written,"
        " gRPC refuses the status (TOO_MANY_OPERATIONS): pilot logs an ERROR and the"
        " client never learns the stream ended; it hangs",
        _status_not_sent,
    ),
    Defect(
        "undecodable-request",
        "a request that does not parse as the method's message ends the call with"
        " UNKNOWN and gRPC logs an ERROR with a DecodeError traceback (every method)",
        _unexpected("google.protobuf.message.DecodeError"),
    ),
    Defect(
        "validity-overflow",
        "CreateCertificate with a validity_duration beyond timedelta's range"
        " (e.g. 2^63-1) ends with UNKNOWN and an OverflowError traceback",
        _unexpected("OverflowError", "istio.v1.auth.IstioCertificateService/"),
    ),
    Defect(
        "csds-invalid-regex",
        "a CSDS node matcher whose safe_regex Python's re cannot compile ends the call"
        " with UNKNOWN and a re.error traceback",
        _unexpected("re.error", "envoy.service.status.v3.ClientStatusDiscoveryService/"),
    ),
    Defect(
        "csds-regex-on-loop",
        "CSDS matches safe_regex with Python's re on the event loop: a backtracking"
        " pattern (or a huge one) stalls pilot, /ready included, for as long as it runs",
        avoid=_slow_regex,
    ),
    Defect(
        "unbounded-names",
        "no bound on the names one request or stream may name: a request with a few"
        " hundred thousand names stalls the event loop (/ready > 100 ms)",
        avoid=_many_names,
    ),
    Defect(
        "unbounded-log-lines",
        "pilot logs client-controlled strings (node ids, type URLs, resource and secret"
        " names, NACK messages) whole: a client decides the size of pilot's log lines",
        _long_log,
    ),
    Defect(
        "secret-warning-per-name",
        "each secret name a stream asks for other than default and ROOTCA is logged as"
        " a warning of its own: one request naming 10,000 of them writes 10,000 lines"
        " and keeps /ready waiting for a quarter of a second",
        _secret_warnings,
    ),
    Defect(
        "sds-no-identity-error-log",
        "with --xds-auth none, a proxy without NAMESPACE/SERVICE_ACCOUNT metadata asking"
        " for `default` makes pilot log at ERROR (a client can flood the error log)",
        _logged("asked for its certificate but proved no identity"),
    ),
)
KNOWN = {defect.key: defect for defect in _DEFECTS}


def explained_by(violation: Violation, seen: Seen) -> Defect | None:
    return next((d for d in _DEFECTS if d.explains(violation, seen)), None)


def avoided_by(call: Call) -> Defect | None:
    return next((d for d in _DEFECTS if d.avoid(call)), None)
