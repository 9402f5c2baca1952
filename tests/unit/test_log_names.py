"""`clipped`: a client's string as it reaches a log line.

A printable name short enough is shown as it is; anything else is escaped
and cut, so that no client forges a line or decides its length.
"""

from __future__ import annotations

import pytest

from pilot.logs import CLIENT_TEXT, clipped


@pytest.mark.parametrize(
    "name", ["sidecar~10.0.0.1~cart-1.shop~shop.svc.cluster.local", "", "ü-ñ", "x" * CLIENT_TEXT]
)
def test_printable_names_are_shown_as_they_are(name: str) -> None:
    assert clipped(name) == name


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("proxy\n2026 INFO forged line", "proxy\\n2026 INFO forged line"),
        ("proxy\r\x00\x1b[31m", "proxy\\r\\x00\\x1b[31m"),
        ("tab\there", "tab\\there"),
        ("\u2028line separator", "\\u2028line separator"),
    ],
)
def test_control_characters_are_escaped(name: str, shown: str) -> None:
    assert clipped(name) == shown
    assert "\n" not in clipped(name) and "\r" not in clipped(name)


def test_long_names_are_cut_and_say_by_how_much() -> None:
    shown = clipped("a" * (CLIENT_TEXT + 50))
    assert shown == "a" * CLIENT_TEXT + "...(+50 chars)"
    hostile = clipped("\n" * 10_000)
    assert hostile == "\\n" * CLIENT_TEXT + f"...(+{10_000 - CLIENT_TEXT} chars)"
