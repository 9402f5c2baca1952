"""Interception modes: how a sidecar's outbound traffic reaches Envoy, which shapes its listeners.

Istio's node metadata `INTERCEPTION_MODE`: REDIRECT (the default; iptables
sends every outbound connection to 15001, `virtualOutbound` hands it to the
listener of its original destination) and TPROXY (the same listeners), or
NONE: nothing is captured, so each outbound listener binds 127.0.0.1:PORT
itself and a client on the machine connects to it. Listeners and routes are
built once per mode (a cache flavor, like `pilot.xds.flavor`) and every
stream reads the flavor of its node's mode. A value pilot does not know is
REDIRECT: whatever a node claims, it picks one of these flavors, never a new one.
"""

from __future__ import annotations

from enum import StrEnum

METADATA_KEY = "INTERCEPTION_MODE"


class Interception(StrEnum):
    """The listener flavor a stream reads."""

    REDIRECT = "REDIRECT"
    NONE = "NONE"


def interception_of(declared: str) -> Interception:
    """The mode a node's `INTERCEPTION_MODE` declares (TPROXY, unknown, absent: REDIRECT)."""
    return Interception.NONE if declared.upper() == Interception.NONE else Interception.REDIRECT
