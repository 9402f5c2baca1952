"""One `grpc.health.v1.Health/Check` call over a connection the agent made itself.

The app's gRPC probe must reach the app from 127.0.0.6, the source the capture rules
leave alone (`pilot.agent.app_probes`), and gRPC's own client cannot choose its source
address. The call is small enough to speak directly: HTTP/2 with prior knowledge, one
stream, request headers as HPACK literals (no table, no Huffman coding), one DATA
frame with the HealthCheckRequest. The answer is read frame by frame until the
HealthCheckResponse arrives; only its `status` is read, so no response header needs
decoding: a server that fails the call sends no message (or RST_STREAM/GOAWAY), which
is not SERVING. At most MAX_FRAMES frames of at most MAX_FRAME bytes are read.
"""

from __future__ import annotations

import asyncio
import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x6, 0x7
END_STREAM, ACK, END_HEADERS, PADDED = 0x1, 0x1, 0x4, 0x8
STREAM = 1
SERVING = 1  # grpc.health.v1.HealthCheckResponse.ServingStatus
MAX_FRAME = 16384  # SETTINGS_MAX_FRAME_SIZE's default: nothing larger is owed to us
MAX_FRAMES = 64
PATH = "/grpc.health.v1.Health/Check"


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return (
        struct.pack("!I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack("!I", stream)
        + payload
    )


def _integer(value: int, prefix_bits: int) -> bytes:
    """HPACK's integer with an N-bit prefix (RFC 7541 5.1), first byte's flags clear."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out, value = bytearray([limit]), value - limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def _literal(name: str, value: str) -> bytes:
    """A header as a literal without indexing, new name, neither Huffman coded."""
    raw_name, raw_value = name.encode("ascii"), value.encode("ascii")
    return (b"\x00" + _integer(len(raw_name), 7) + raw_name
            + _integer(len(raw_value), 7) + raw_value)  # fmt: skip


def request(authority: str, service: str) -> bytes:
    """Everything the client sends: preface, SETTINGS, HEADERS, DATA (end of stream)."""
    headers = b"".join(
        _literal(name, value)
        for name, value in (
            (":method", "POST"), (":scheme", "http"), (":path", PATH),
            (":authority", authority), ("content-type", "application/grpc"), ("te", "trailers"),
        )
    )  # fmt: skip
    raw_service = service.encode("ascii")
    # HealthCheckRequest: field 1 (service), length-delimited; empty: the server as a whole.
    message = b"\x0a" + _varint(len(raw_service)) + raw_service if raw_service else b""
    body = b"\x00" + struct.pack("!I", len(message)) + message
    return (
        PREFACE
        + _frame(SETTINGS, 0, 0)
        + _frame(HEADERS, END_HEADERS, STREAM, headers)
        + _frame(DATA, END_STREAM, STREAM, body)
    )


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def serving(message: bytes) -> bool:
    """Whether a gRPC message (5-byte prefix, HealthCheckResponse) says SERVING."""
    if len(message) < 5 or message[0] != 0:
        return False
    payload = message[5 : 5 + struct.unpack("!I", message[1:5])[0]]
    # HealthCheckResponse: field 1 (status), varint; SERVING is 1 (a single byte).
    return payload[:2] == bytes([0x08, SERVING])


async def check(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, authority: str,
                service: str) -> bool:  # fmt: skip
    """Send the Check call on this connection and read until its answer (or its end)."""
    writer.write(request(authority, service))
    await writer.drain()
    received = b""
    for _ in range(MAX_FRAMES):
        head = await reader.readexactly(9)
        length = int.from_bytes(head[:3], "big")
        kind, flags, stream = head[3], head[4], struct.unpack("!I", head[5:9])[0] & 0x7FFFFFFF
        if length > MAX_FRAME:
            return False
        payload = await reader.readexactly(length)
        if kind == SETTINGS and not flags & ACK:
            writer.write(_frame(SETTINGS, ACK, 0))
        elif kind == PING and not flags & ACK:
            writer.write(_frame(PING, ACK, 0, payload))
        elif kind in (GOAWAY, RST_STREAM) and stream in (0, STREAM):
            return False
        elif kind == DATA and stream == STREAM:
            if flags & PADDED and payload:
                payload = payload[1 : len(payload) - payload[0]]
            received += payload
            if len(received) >= 5 and len(received) >= 5 + struct.unpack("!I", received[1:5])[0]:
                return serving(received)
        elif kind == HEADERS and stream == STREAM and flags & END_STREAM:
            return False  # trailers only: the call failed
    return False
