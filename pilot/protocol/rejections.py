"""Which resources of a rejected response Envoy rejected, read from its NACK's message.

A NACK (`error_detail`) answers a whole response, but for listeners and clusters
Envoy applies every resource it can and lists the ones it could not, in its own
words, each as `NAME: WHY`:

- LDS: `Error adding/updating listener(s) ` then `NAME: WHY` ending in a newline,
  one per listener (Envoy's lds_api.cc);
- CDS: `Error adding/updating cluster(s) ` then `NAME: WHY` joined by `, `
  (cds_api_impl.cc).

So for those two types a recognised message blames the names it lists and
the others of the response were applied. For routes, assignments and secrets
(and for a message of any other shape: a resource that failed to decode, say)
Envoy's words do not reliably name the resource, and which of a response's
resources it applied depends on its own watch order: the whole response is
taken as rejected, with the whole message. Envoy cuts its message at 4,096
characters and adds `...(truncated)`: the names past the cut are unknown, so
the unnamed ones are then taken as rejected with the whole message too.
Honest either way: never ACKED when Envoy may not hold it, and never all
ERROR while Envoy serves most of them when its message says which.

The message is text a client wrote. Only `MAX_MESSAGE_CHARS` of it are read
and kept (Envoy never sends more), `MAX_WHY_CHARS` of what it says of one
name; only names the response carried can be blamed (a name the client never
got is never a resource); and every message kept is one printable line:
control characters (newlines, terminal escapes, bidirectional overrides) are
escaped as Python writes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from pilot.xds import types

ENVOY_CUT = "...(truncated)"  # what Envoy appends to a message it cut at 4,096 characters
MAX_MESSAGE_CHARS = 4096 + len(ENVOY_CUT)
# What one name's rejection keeps: a stream holds one per rejected name, and a client
# that NACKs name after name must not make that a megabyte each.
MAX_WHY_CHARS = 1000
# A name may itself hold ": " (Envoy splits nothing: it writes `NAME: WHY`); look this far.
HEAD_TRIES = 4


@dataclass(frozen=True, slots=True)
class _Form:
    prefix: str
    separator: str


_FORMS: Mapping[str, _Form] = {
    types.LISTENER: _Form("Error adding/updating listener(s) ", "\n"),
    types.CLUSTER: _Form("Error adding/updating cluster(s) ", ", "),
}


@dataclass(frozen=True, slots=True)
class Rejection:
    """What one NACK says: its message (one bounded line) and whom it blames.

    `blamed` maps each name the message names to what it says of that name.
    `partial`: Envoy applied every other resource of the response; when False
    the unnamed ones are rejected too, with `message`.
    """

    message: str
    blamed: Mapping[str, str] = field(default_factory=dict)
    partial: bool = False


def printable(text: str) -> str:
    """`text` on one line: every control character escaped (`\\n`, `\\x1b`, `\\u202e`)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def read_rejection(type_url: str, message: str, sent: AbstractSet[str]) -> Rejection:
    """Read a NACK's `message` for a response of `type_url` that carried `sent`."""
    cut = len(message) > MAX_MESSAGE_CHARS
    text = message[:MAX_MESSAGE_CHARS]
    whole = _clipped(printable(text), MAX_MESSAGE_CHARS, len(message) - len(text))
    form = _FORMS.get(type_url)
    if form is None or not sent or not text.startswith(form.prefix):
        return Rejection(whole)
    body = text[len(form.prefix) :]
    truncated = cut or body.endswith(ENVOY_CUT)
    if truncated:  # its last entry is cut short: whatever it names stays rejected whole
        body = body[: -len(ENVOY_CUT)] if body.endswith(ENVOY_CUT) else body
        body = body.rpartition(form.separator)[0]
    blamed = _entries(body, form.separator, sent)
    if not blamed:
        return Rejection(whole)
    return Rejection(whole, blamed, partial=not truncated)


def _entries(body: str, separator: str, sent: AbstractSet[str]) -> dict[str, str]:
    """`NAME: WHY` entries by name, for names in `sent`; {} if the body does not start
    with one. A piece that starts no entry belongs to the one before (a WHY may hold
    the separator)."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for piece in body.split(separator):
        name = _head(piece, sent)
        if name is not None:
            current = found.setdefault(name, [])
            current.append(piece[len(name) + 2 :])
        elif current is None:
            return {}  # text before any name: not Envoy's list
        else:
            current[-1] += separator + piece
    return {name: _why("; ".join(w.strip() for w in whys)) for name, whys in found.items()}


def _why(text: str) -> str:
    """What the message says of one name: one line, at most `MAX_WHY_CHARS` of it."""
    return _clipped(printable(text), MAX_WHY_CHARS)


def _clipped(shown: str, limit: int, dropped: int = 0) -> str:
    """`shown` (already escaped, which can make it longer) cut at `limit` characters."""
    dropped += max(0, len(shown) - limit)
    return f"{shown[:limit]}...(+{dropped} chars)" if dropped else shown


def _head(piece: str, sent: AbstractSet[str]) -> str | None:
    """The name `piece` starts with, followed by ": ", if it is one the response carried."""
    start = 0
    for _ in range(HEAD_TRIES):
        end = piece.find(": ", start)
        if end < 0:
            return None
        if piece[:end] in sent:
            return piece[:end]
        start = end + 1
    return None
