"""Logging setup: levels per component (Istio style) and a JSON format for log pipelines.

`--log-level info,xds:debug,kubernetes:warning` sets the default level, then
per-scope levels. Scopes name pilot's components (`xds`, `push`, `file`,
`kubernetes`, `security`, `ca`, `sds`, `agent`, `limits`, `supervisor`, and
`pilot` for all of them); any other name is an error (`LogSpecError`), as a
typo would otherwise leave the level unchanged without a word.

Clients decide many strings pilot logs (node ids, type URLs, names, NACK
messages): `clipped` shows one escaped and cut short, and every message is cut
at `MAX_MESSAGE` characters whatever it holds, so no client decides the size
of a log line.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import sys
import time
from collections.abc import Mapping
from typing import Final, TextIO

SCOPES: Final = {
    "xds": "pilot.xds",
    "push": "pilot.push",
    "file": "pilot.sources.file",
    "kubernetes": "pilot.sources.kubernetes",
    "security": "pilot.security",
    "ca": "pilot.security.ca",
    "sds": "pilot.security.sds",
    "agent": "pilot.agent",
    "limits": "pilot.limits",
    "supervisor": "pilot.supervisor",
    "pilot": "pilot",
}
LEVELS: Final = ("debug", "info", "warning", "error")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MAX_MESSAGE = 4096
MAX_WAITING = 512  # lines kept for the next write before they are written anyway
FLUSH_INTERVAL = 0.05  # seconds an info line logged on the loop waits, at most
CLIENT_TEXT = 200


def clipped(text: str, limit: int = CLIENT_TEXT) -> str:
    """A client's string for a log line: control characters escaped, at most `limit` shown."""
    if len(text) <= limit and text.isprintable():
        return text  # the common case, without a look at each character
    shown = text if len(text) <= limit else text[:limit]
    escaped = "".join(c if c.isprintable() else repr(c)[1:-1] for c in shown)
    return escaped if len(text) <= limit else f"{escaped}...(+{len(text) - limit} chars)"


def _cut(message: str) -> str:
    if len(message) <= MAX_MESSAGE:
        return message
    return f"{message[:MAX_MESSAGE]}...(+{len(message) - MAX_MESSAGE} chars)"


class TextFormatter(logging.Formatter):
    """Istio-like text lines, the message cut at MAX_MESSAGE characters."""

    def __init__(self, fmt: str) -> None:
        super().__init__(fmt)
        self._second: tuple[int, str] = (-1, "")  # one attribute: swapped whole, thread-safe
        self._istio_text = fmt == TEXT_FORMAT

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = _cut(record.message)
        if self._istio_text:
            # TEXT_FORMAT written out: `%` over the record's whole __dict__ cost a fifth
            # of a line, and proxies arriving together log thousands of lines.
            return f"{record.asctime} {record.levelname} {record.name}: {record.message}"
        return super().formatMessage(record)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """logging's own `asctime`, its date and time of day formatted once a second."""
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        return self._stamp(int(record.created), int(record.msecs))

    def _stamp(self, second: int, msecs: int) -> str:
        cached, stamp = self._second
        if second != cached:
            stamp = time.strftime(self.default_time_format, self.converter(second))
            self._second = (second, stamp)
        return f"{stamp},{msecs:03d}"  # logging's default_msec_format

    def info_line(self, name: str, message: str) -> str | None:
        """The line `format` writes for an INFO record of logger `name` without exception or
        stack, logged now; None unless the format is TEXT_FORMAT."""
        if not self._istio_text:
            return None
        now = time.time()
        second = int(now)
        return f"{self._stamp(second, int((now - second) * 1000))} INFO {name}: {_cut(message)}"


class LogSpecError(ValueError):
    """A --log-level value pilot cannot use."""


def parse_levels(spec: str) -> tuple[str, dict[str, str]]:
    """`info,xds:debug` -> ("INFO", {"pilot.xds": "DEBUG"})."""
    default, scoped = "INFO", {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        scope, _, level = part.rpartition(":")
        if level.lower() not in LEVELS:
            raise LogSpecError(f"--log-level {part!r}: level must be one of {', '.join(LEVELS)}")
        if scope in ("", "default"):
            default = level.upper()
        elif scope in SCOPES:
            scoped[SCOPES[scope]] = level.upper()
        else:
            raise LogSpecError(
                f"--log-level {part!r}: unknown component {scope!r}"
                f" (components: {', '.join(SCOPES)})"
            )
    return default, scoped


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, scope, msg (and error when there is one)."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(),
            "level": record.levelname.lower(),
            "scope": record.name,
            "msg": _cut(record.getMessage()),
        }
        if record.exc_info:
            entry["error"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class BatchingHandler(logging.StreamHandler[TextIO]):
    """Lines logged on the event loop are written together, every `FLUSH_INTERVAL` at most.

    Thousands of proxies arriving at once log thousands of lines a second. Each
    write is a system call and a wake-up of whatever reads the pipe, and it lets
    go of the GIL: a thread waiting for it (gRPC's, pilot's minting thread) takes
    it, and the loop waits to get it back. Written once per turn of the loop, the
    lines of a burst of certificates cost pilot 8% of its CPU per certificate;
    written once per interval, hardly anything. So a line logged on a running
    loop waits for the interval's end (`call_later`), and then every line
    waiting goes out in one write. Three kinds of line are written at once,
    after any that wait, so the order holds: a warning or worse, a line from
    another thread, and a line logged with no loop running. At most
    `MAX_WAITING` lines wait; `logging.shutdown` writes what waits at exit.
    """

    def __init__(self, stream: TextIO, interval: float = FLUSH_INTERVAL) -> None:
        super().__init__(stream)
        self.interval = interval
        self._waiting: list[str] = []
        self._flush_on: asyncio.AbstractEventLoop | None = None  # the loop due to write them

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + self.terminator
        except Exception:  # as StreamHandler: a bad record is reported, not raised
            self.handleError(record)
            return
        loop = _running_loop()
        self._queue(line, None if record.levelno >= logging.WARNING else loop)

    def _queue(self, line: str, loop: asyncio.AbstractEventLoop | None) -> None:
        """Keep `line` for the interval's write on `loop`; with no loop, write it and what
        waits now."""
        self._waiting.append(line)
        if loop is None or len(self._waiting) >= MAX_WAITING:
            self._write_waiting()
        elif self._flush_on is not loop:
            self._flush_on = loop
            loop.call_later(self.interval, self.flush)

    def write_info(self, name: str, message: str) -> bool:
        """Write an INFO line of logger `name` as `emit` would, without a record; False when
        this handler would not write it so (a filter, a level, another format)."""
        formatter = self.formatter
        if self.filters or self.level > logging.INFO or not isinstance(formatter, TextFormatter):
            return False
        line = formatter.info_line(name, message)
        loop = _running_loop()
        if line is None or loop is None:
            return False
        self.acquire()  # as Handler.handle holds it around emit
        try:
            self._queue(line + self.terminator, loop)
        finally:
            self.release()
        return True

    def flush(self) -> None:
        self.acquire()
        try:
            self._write_waiting()
        finally:
            self.release()

    def _write_waiting(self) -> None:
        self._flush_on = None
        lines, self._waiting = "".join(self._waiting), []
        try:
            if lines:
                self.stream.write(lines)
            super().flush()
        except Exception:  # a closed or broken stderr must not stop the loop, or the caller
            return


def info(logger: logging.Logger, message: str, *args: object) -> None:
    """`logger.info(message, *args)`, for the lines logged once per proxy, thousands a
    second when proxies arrive together.

    The same line. When pilot's own handler is the only one that would see it,
    with no filter on the way, it gets the line without a LogRecord: half of a
    line's cost was logging's record and its walk through the handlers. Any
    other set-up (a test's capture, a filter, the JSON format) gets the record.
    """
    if not logger.isEnabledFor(logging.INFO):
        return
    handler = _sole_handler(logger)
    if handler is not None and not (len(args) == 1 and isinstance(args[0], Mapping)):
        try:
            text = message % args if args else message
        except Exception:  # logging's own path reports a bad format, and raises nothing
            text = None
        if text is not None and handler.write_info(logger.name, text):
            return
    logger.info(message, *args, stacklevel=2)


def _sole_handler(logger: logging.Logger) -> BatchingHandler | None:
    """pilot's handler if it is the only one a record of `logger` would reach unfiltered."""
    found: BatchingHandler | None = None
    current: logging.Logger | None = logger
    while current is not None:
        if current.filters:
            return None
        for handler in current.handlers:
            if found is not None or not isinstance(handler, BatchingHandler):
                return None
            found = handler
        if not current.propagate:
            break
        current = current.parent
    return found


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _record_only_what_is_shown() -> None:
    """Neither format shows the caller's file and line, the thread or the process: skip
    finding them for each record (the logging HOWTO's "Optimization")."""
    logging._srcfile = None  # the HOWTO's documented switch
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def configure(spec: str, log_format: str = "text") -> None:
    """Install one stderr handler with the chosen format and levels."""
    default, scoped = parse_levels(spec)
    _record_only_what_is_shown()
    handler = BatchingHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(default)
    for name, level in scoped.items():
        logging.getLogger(name).setLevel(level)
