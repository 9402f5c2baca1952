"""Request bytes into protobuf messages: a message that does not decode is the caller's error.

pilot's gRPC handlers take raw bytes and decode them here, so that garbage is
answered INVALID_ARGUMENT with one line saying so, never UNKNOWN with a
traceback from inside grpc.
"""

from __future__ import annotations

from typing import TypeVar

from google.protobuf.message import DecodeError


class BadRequest(ValueError):
    """The request bytes are not the message they should be."""


M = TypeVar("M")


def decode(message_class: type[M], data: bytes) -> M:
    """Parse `data` as `message_class`; raises BadRequest naming the message type."""
    try:
        message: M = message_class.FromString(data)  # type: ignore[attr-defined]
    except (DecodeError, RuntimeError, ValueError) as error:
        name = getattr(message_class, "DESCRIPTOR", None)
        full_name = name.full_name if name is not None else message_class.__name__
        raise BadRequest(f"the request is not a valid {full_name}: {error}") from error
    return message
