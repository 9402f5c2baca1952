"""What one fuzz example sends: a `Call` to one method, its requests, and its credentials.

A request is either raw bytes (sent as they are: random bytes, mutated messages) or an
`XdsStep`, a DiscoveryRequest or DeltaDiscoveryRequest whose nonce may be taken, when it
is sent, from the latest response of its type (as an Envoy ACKs or NACKs). Calls are
plain data: Hypothesis prints them when a property fails, without the bulk of huge
names (see `short`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from envoy.service.discovery.v3 import discovery_pb2

from tests.fuzz.methods import Method

XdsRequest = discovery_pb2.DiscoveryRequest | discovery_pb2.DeltaDiscoveryRequest


class Credentials(Enum):
    """Who the call says it is (what `authorization` carries)."""

    DEFAULT = "default"  # the target's own valid token (none with --xds-auth none)
    NONE = "none"  # no authorization header at all
    OTHER = "other"  # a valid token of another account (ns-a/attacker)
    WRONG_AUDIENCE = "wrong-audience"  # a real token, for an audience pilot does not accept


@dataclass(frozen=True)
class Header:
    """An `authorization` header value sent as is (garbage tokens, other schemes)."""

    value: str

    def __repr__(self) -> str:
        return f"Header({short(self.value)})"


@dataclass(frozen=True, eq=False)
class XdsStep:
    """One xDS request; `last_nonce` fills response_nonce with the latest of its type."""

    message: XdsRequest
    last_nonce: bool = False

    def __repr__(self) -> str:
        return f"XdsStep({describe(self.message)}{', last_nonce' if self.last_nonce else ''})"


Request = bytes | XdsStep | Any  # Any: another protobuf message, serialized when sent


@dataclass(frozen=True, eq=False)
class Call:
    """One example: these requests to `method`, with these credentials."""

    method: Method
    requests: tuple[Request, ...]
    credentials: Credentials | Header = Credentials.DEFAULT
    note: str = field(default="", compare=False)  # what the strategy meant, for reports

    def __repr__(self) -> str:
        distinct = len({id(r) for r in self.requests})
        limit = 6 if distinct > 2 else 2  # a storm: two requests, alternating
        shown = ", ".join(_show(r) for r in self.requests[:limit])
        more = f", ... {len(self.requests)} in all" if len(self.requests) > limit else ""
        credentials = (
            self.credentials.value
            if isinstance(self.credentials, Credentials)
            else repr(self.credentials)
        )
        return f"Call({self.method}, [{shown}{more}], credentials={credentials})"

    def messages(self) -> list[Any]:
        """The protobuf messages among the requests (XdsSteps' included)."""
        found = []
        for request in self.requests:
            if isinstance(request, XdsStep):
                found.append(request.message)
            elif not isinstance(request, bytes):
                found.append(request)
        return found


def short(text: str | bytes, limit: int = 60) -> str:
    """A value for a report: itself if short, else its start and its length."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}...({len(text)} long)"


def describe(message: Any) -> str:
    """A protobuf message on one line, long strings and lists cut short."""
    parts = []
    for descriptor, value in message.ListFields():
        parts.append(f"{descriptor.name}={_value(descriptor, value)}")
    return f"{type(message).__name__}({', '.join(parts)})"


def _value(descriptor: Any, value: Any) -> str:
    if isinstance(value, str | bytes):
        return short(value)
    if hasattr(value, "keys"):
        return f"<map of {len(value)}>"
    if descriptor.is_repeated:
        items = list(value)
        shown = [describe(v) if hasattr(v, "ListFields") else _value_plain(v) for v in items[:3]]
        more = f", ...{len(items)} in all" if len(items) > 3 else ""
        return f"[{', '.join(shown)}{more}]"
    if hasattr(value, "ListFields"):
        return describe(value)
    return repr(value)


def _value_plain(value: Any) -> str:
    return short(value) if isinstance(value, str | bytes) else repr(value)


def _show(request: Request) -> str:
    if isinstance(request, bytes):
        return short(request, 40)
    if isinstance(request, XdsStep):
        return repr(request)
    return describe(request)
