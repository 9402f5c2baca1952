"""Durations written as Istio (Go) writes them: `100ms`, `10s`, `1m30s`, `24h`, and `30d`.

Every duration pilot reads (flags and environment variables) goes through
`parse_duration`, so each accepts the same units, `d` (days) included, and
refuses a negative or malformed one with the same message.
"""

from __future__ import annotations

import re

_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h|d)")
EXAMPLES = "e.g. 100ms, 10s, 1m30s, 24h, 30d"


def parse_duration(text: str) -> float:
    """Seconds in a Go-style duration; raises ValueError naming the bad text."""
    value = text.strip()
    if value == "":
        raise ValueError(f"empty duration ({EXAMPLES})")
    if value == "0":
        return 0.0
    if value.startswith("-"):
        raise ValueError(f"{text!r} is negative (a duration is 0 or more: {EXAMPLES})")
    position, total = 0, 0.0
    for match in _PART.finditer(value):
        if match.start() != position:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        position = match.end()
    if position != len(value) or position == 0:
        raise ValueError(f"{text!r} is not a duration ({EXAMPLES})")
    return total
