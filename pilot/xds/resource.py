"""An xDS resource serialized exactly once, with its wire fragments precomputed.

A `Resource` holds the deterministic serialization of one message plus the
protobuf wire bytes of the fields it becomes inside a SotW `DiscoveryResponse`
(`resources`, field 2: an `Any`) and inside a `DeltaDiscoveryResponse`
(`resources`, field 2: a `Resource` with name, version and the `Any`). Every
stream that sends this version of the resource concatenates the same bytes;
nothing is re-encoded per stream. Responses are assembled here too, so that the
whole wire path shares one encoder.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol


class Message(Protocol):
    """The part of a protobuf message this module needs."""

    def SerializeToString(self, *, deterministic: bool = ...) -> bytes: ...


_ONE_BYTE = tuple(bytes([value]) for value in range(0x80))


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _ONE_BYTE[value]  # tags and most lengths: no loop, no allocation
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def length_delimited(field_number: int, payload: bytes) -> bytes:
    """Encode one length-delimited (wire type 2) protobuf field."""
    # One-byte tag and length inline, the common case: a response assembles several.
    tag, size = (field_number << 3) | 2, len(payload)
    head = _ONE_BYTE[tag] if tag < 0x80 else _varint(tag)
    return head + (_ONE_BYTE[size] if size < 0x80 else _varint(size)) + payload


def varint_field(field_number: int, value: int) -> bytes:
    """Encode one varint (wire type 0) protobuf field."""
    return _varint(field_number << 3) + _varint(value)


def _string_field(field_number: int, text: str) -> bytes:
    return length_delimited(field_number, text.encode()) if text else b""


@functools.lru_cache(maxsize=1024)
def _shared_field(field_number: int, text: str) -> bytes:
    """A string field every stream writes alike (type URL, version): encoded once."""
    return _string_field(field_number, text)


def content_version(payload: bytes) -> str:
    """A version derived from content: equal bytes give equal versions, across restarts too."""
    return hashlib.blake2b(payload, digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class Resource:
    """One version of one named resource, encoded once for every stream."""

    type_url: str
    name: str
    version: str
    payload: bytes = field(repr=False)  # may hold a private key: never in logs
    sotw_field: bytes = field(repr=False)
    delta_field: bytes = field(repr=False)

    @classmethod
    def from_payload(cls, type_url: str, name: str, payload: bytes) -> Resource:
        """Wrap already-serialized message bytes; the version is their content hash."""
        version = content_version(payload)
        any_field = length_delimited(2, _shared_field(1, type_url) + length_delimited(2, payload))
        delta_resource = length_delimited(1, version.encode()) + any_field + _string_field(3, name)
        return cls(
            type_url=type_url,
            name=name,
            version=version,
            payload=payload,
            sotw_field=any_field,
            delta_field=length_delimited(2, delta_resource),
        )

    @classmethod
    def from_message(cls, type_url: str, name: str, message: Message) -> Resource:
        """Serialize a message deterministically (the one serialization it gets)."""
        return cls.from_payload(type_url, name, message.SerializeToString(deterministic=True))


def encode_sotw_response(
    type_url: str, version_info: str, nonce: str, resources: Iterable[Resource]
) -> bytes:
    """Wire bytes of an `envoy.service.discovery.v3.DiscoveryResponse`."""
    parts = [_shared_field(1, version_info)]
    parts.extend(r.sotw_field for r in resources)
    parts.append(_shared_field(4, type_url))
    parts.append(_string_field(5, nonce))
    return b"".join(parts)


def encode_delta_response(
    type_url: str,
    system_version_info: str,
    nonce: str,
    resources: Iterable[Resource],
    removed: Iterable[str],
) -> bytes:
    """Wire bytes of an `envoy.service.discovery.v3.DeltaDiscoveryResponse`."""
    parts = [_shared_field(1, system_version_info)]
    parts.extend(r.delta_field for r in resources)
    parts.append(_shared_field(4, type_url))
    parts.append(_string_field(5, nonce))
    parts.extend(length_delimited(6, name.encode()) for name in removed)
    return b"".join(parts)
