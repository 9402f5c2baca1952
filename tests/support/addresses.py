"""Addresses of this machine, for tests that need a caller (or a listener) off loopback.

A caller off loopback is this machine calling its own non-loopback address, from that
address: pilot sees a remote address that is not loopback, as it would for another
host. Tests that need one skip when the machine has none.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket

import pytest

# Documentation addresses: a UDP socket "connected" to one sends nothing, but the
# kernel picks the local address it would send from, if there is a route.
_ROUTE_PROBES = ((socket.AF_INET, "198.51.100.1"), (socket.AF_INET6, "2001:db8::1"))


def outside_address() -> str:
    """A non-loopback address of this machine (IPv4 first); skips the test if none."""
    for family, probe in _ROUTE_PROBES:
        with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((probe, 9))
            address: str = sock.getsockname()[0]
            if not ipaddress.ip_address(address).is_loopback:
                return address
    pytest.skip("no non-loopback address on this machine: no caller can be off loopback")


def url(address: str, port: int, path: str) -> str:
    """http://ADDRESS:PORT/PATH, IPv6 addresses in brackets."""
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}{path}"
