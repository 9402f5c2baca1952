"""What must hold after every example, as a list of `Violation`s (empty: all held).

1. pilot is alive;
2. no status is UNKNOWN, nor INTERNAL unless gRPC itself says so (its transport's
   own messages, `GRPC_INTERNAL`);
3. pilot logged no ERROR (or worse) and no traceback for it;
4. `/ready` answered 200, during the example and right after, each probe within
   `LIVENESS_BOUND` (2 s: liveness; the 100 ms latency target is `bench.fuzz`'s);
5. an xDS stream pilot kept open answered its final request (see `exchange`), and
   every answer decoded as the method's response;
6. no log line is longer than `LOG_LINE_LIMIT`: what a client sends must not come
   back as log lines of whatever size it likes.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from tests.fuzz.exchange import Outcome
from tests.fuzz.ready import Sample
from tests.support.pilot_process import Entry

GRPC_INTERNAL = ("RST_STREAM", "HTTP/2", "Stream removed", "Exception deserializing", "Socket")
_CORE_ERROR = re.compile(r"^[EF]\d{4} ")  # gRPC core's own error and fatal lines

DIED = "died"
STATUS = "status"
LOGGED = "logged"
SLOW_READY = "slow-ready"
UNANSWERED = "unanswered"
BAD_ANSWER = "bad-answer"
LONG_LOG = "long-log"
LOG_LINE_LIMIT = 16 * 1024


@dataclass(frozen=True)
class Violation:
    """One property that did not hold."""

    kind: str
    detail: str
    method: str = ""  # the path of the example's method
    code: grpc.StatusCode | None = None
    entry: Entry | None = None

    @property
    def text(self) -> str:
        """Everything the violation says, tracebacks included (for matching)."""
        if self.entry is None:
            return self.detail
        return f"{self.entry['msg']}\n{self.entry.get('error', '')}"

    def __str__(self) -> str:
        text = f"{self.kind}: {self.detail}"
        if self.entry is not None and self.entry.get("error"):
            last = self.entry["error"].strip().splitlines()[-1]
            text += f" [{last}]"
        return text


def coalesce(entries: Sequence[Entry]) -> list[Entry]:
    """Entries with every raw (non-JSON) traceback printed line by line made one entry,
    its first line as `msg` and the whole of it as `error`."""
    merged: list[Entry] = []
    block: list[str] | None = None
    for entry in entries:
        raw = not entry["level"] and not entry["scope"]
        if raw and block is None and entry["msg"].startswith("Traceback (most recent call"):
            block = [entry["msg"]]
            merged.append({**entry, "error": ""})
        elif raw and block is not None:
            block.append(entry["msg"])
            merged[-1]["error"] = "\n".join(block)
            continue
        else:
            block = None
            merged.append(entry)
    return merged


def bad_entry(entry: Entry) -> bool:
    """A log line at ERROR or worse, or one carrying a traceback."""
    return (
        entry["level"] in ("error", "critical")
        or bool(entry.get("error"))
        or "Traceback (most recent call last)" in entry["msg"]
        or bool(_CORE_ERROR.match(entry["msg"]))
    )


def _status(outcome: Outcome) -> list[Violation]:
    code = outcome.code
    if code is grpc.StatusCode.UNKNOWN:
        return [Violation(STATUS, f"UNKNOWN {outcome.details!r}", code=code)]
    if code is grpc.StatusCode.INTERNAL and not any(t in outcome.details for t in GRPC_INTERNAL):
        return [Violation(STATUS, f"INTERNAL {outcome.details!r}", code=code)]
    return []


def _stream(outcome: Outcome) -> list[Violation]:
    found = []
    if outcome.answered is False:
        found.append(Violation(UNANSWERED, f"an open stream did not answer: {outcome}"))
    if outcome.bad_answer:
        found.append(Violation(BAD_ANSWER, outcome.bad_answer))
    return found


def violations(
    method: str, outcome: Outcome, entries: Sequence[Entry], ready: Sample | None, alive: bool
) -> list[Violation]:
    """Every property of the module docstring that did not hold for one example of
    `method` (a path)."""
    if not alive:
        return [Violation(DIED, "pilot exited", method)]
    found = _status(outcome) + _stream(outcome)
    found += [
        Violation(LOGGED, f"{e['level']} {e['scope']}: {e['msg']}", entry=e)
        for e in coalesce(entries)
        if bad_entry(e)
    ]
    found += [
        Violation(LONG_LOG, f"{e['size']} characters: {e['level']} {e['scope']}: {e['msg'][:80]}")
        for e in entries
        if int(e.get("size", 0)) > LOG_LINE_LIMIT
    ]
    if ready is None:
        found.append(Violation(SLOW_READY, "/ready could not be probed"))
    elif not ready.ok:
        found.append(Violation(SLOW_READY, str(ready)))
    return [dataclasses.replace(v, method=method) for v in found]
