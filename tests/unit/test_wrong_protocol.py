"""Telling a TLS or HTTP/2 client on the HTTP port from its first bytes, and saying so
at most once a minute per protocol while counting every one (a controlled clock)."""

from __future__ import annotations

import logging

import pytest

from pilot.debug.wrong_protocol import (
    HTTP2,
    LOG_EVERY,
    TLS,
    UNDECIDED,
    WrongProtocols,
    sniff,
)

CLIENT_HELLO = bytes.fromhex("160301020001000001fc0303")  # what ssl sends first
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@pytest.mark.parametrize(
    ("first", "expected"),
    [
        (CLIENT_HELLO, TLS),
        (b"\x16\x03", TLS),
        (PREFACE, HTTP2),
        (b"", UNDECIDED),
        (b"\x16", UNDECIDED),
        (b"PRI * HTTP/2", UNDECIDED),
        (b"GET /ready HTTP/1.1\r\n", None),
        (b"POST / HTTP/1.1\r\n", None),
        (b"PRIZE / HTTP/1.1\r\n", None),
        (b"\x16\x01", None),
        (b"\x00\x00", None),
    ],
)
def test_first_bytes(first: bytes, expected: str | None) -> None:
    assert sniff(first) == expected


def test_a_line_per_protocol_per_minute_and_every_one_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [1000.0]
    counted: list[str] = []
    wrong = WrongProtocols(counted.append, lambda: "xDS (gRPC) is port 15010", lambda: now[0])
    caplog.set_level(logging.WARNING, logger="pilot")
    for _ in range(500):
        wrong.report(TLS, 15014, "10.0.0.5")
        wrong.report(HTTP2, 15014, "10.0.0.6")
        now[0] += 0.01
    assert [r.getMessage() for r in caplog.records] == [
        "a TLS client on the HTTP port 15014 (from 10.0.0.5), which is plain HTTP/1.1:"
        " the wrong port? xDS (gRPC) is port 15010",
        "an HTTP/2 client (gRPC, or Envoy) on the HTTP port 15014 (from 10.0.0.6), which is"
        " plain HTTP/1.1: the wrong port? xDS (gRPC) is port 15010",
    ]
    now[0] += LOG_EVERY
    wrong.report(TLS, 15014, "10.0.0.7")
    assert (
        caplog.records[-1]
        .getMessage()
        .endswith(
            "(from 10.0.0.7), which is plain HTTP/1.1: the wrong port? xDS (gRPC) is port 15010"
            " (499 more since the last such line)"
        )
    )
    assert len(caplog.records) == 3
    assert (counted.count(TLS), counted.count(HTTP2)) == (501, 500)
