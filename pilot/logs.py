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

import datetime
import json
import logging
import sys
from typing import Final

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

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = _cut(record.message)
        return super().formatMessage(record)


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


def configure(spec: str, log_format: str = "text") -> None:
    """Install one stderr handler with the chosen format and levels."""
    default, scoped = parse_levels(spec)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(default)
    for name, level in scoped.items():
        logging.getLogger(name).setLevel(level)
