"""The listen addresses pilot was given, checked before anything starts.

Each `--grpc-addr`, `--grpc-tls-addr`, `--http-addr` and `--debug-addr` must be
`HOST:PORT`, its host must resolve, and its port must be free to bind. Checked
here, a mistake is one line naming the flag (`SettingsError`), before pilot logs
anything, loads its CA or asks Kubernetes; left to the servers it was an errno
without the flag (`Name or service not known`), or a gRPC core log line and a
GRPC_VERBOSITY hint before the message.

The check binds each address with a probe socket and keeps every probe open
until all are bound, so two flags naming one address are caught too; the probes
are closed before the servers bind. A port taken in between is still reported
by the server that fails to bind it.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Sequence
from typing import Any

from pilot.settings import SettingsError, split_host_port

Flagged = tuple[str, str]  # (the flag, the address it gave)


def check_address_forms(addresses: Sequence[Flagged]) -> None:
    """Raise SettingsError naming the first flag whose address is not HOST:PORT."""
    for flag, address in addresses:
        if address:
            _host_port(flag, address)


def check_listen_addresses(addresses: Sequence[Flagged]) -> None:
    """Raise SettingsError naming the first flag whose address pilot cannot listen on."""
    given = [(flag, address) for flag, address in addresses if address]
    check_address_forms(given)
    _no_address_twice(given)
    with contextlib.ExitStack() as probes:
        for flag, address in given:
            _probe(probes, flag, address)


def _probe(probes: contextlib.ExitStack, flag: str, address: str) -> None:
    """Bind every socket address `address` resolves to, the probes kept in `probes`.

    Like the servers, one bound address is enough (`localhost` may resolve to an
    IPv6 address this host lacks), but a port in use or forbidden on any is an error.
    """
    failures: list[OSError] = []
    resolved = _resolved(flag, address)
    for family, sockaddr in resolved:
        probe = probes.enter_context(socket.socket(family, socket.SOCK_STREAM))
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as error:
            failures.append(error)
    fatal = [e for e in failures if e.errno in (errno.EADDRINUSE, errno.EACCES)]
    if fatal or (failures and len(failures) == len(resolved)):
        raise SettingsError(f"{flag} {address}: {_why((fatal or failures)[0])}")


def _no_address_twice(given: Sequence[Flagged]) -> None:
    seen: dict[tuple[str, int], str] = {}
    for flag, address in given:
        host, port = _host_port(flag, address)
        if port and (host, port) in seen:
            raise SettingsError(f"{flag} {address}: {seen[host, port]} already listens there")
        seen[host, port] = flag


def _host_port(flag: str, address: str) -> tuple[str, int]:
    try:
        return split_host_port(address)
    except SettingsError:
        raise SettingsError(
            f"{flag} {address!r}: expected HOST:PORT (e.g. 127.0.0.1:15010)"
        ) from None


def _resolved(flag: str, address: str) -> list[tuple[socket.AddressFamily, tuple[Any, ...]]]:
    """The socket addresses `address` resolves to, as a server binding it would see them."""
    host, port = _host_port(flag, address)
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as error:
        reason = error.strerror if isinstance(error, socket.gaierror) else str(error)
        raise SettingsError(f"{flag} {address}: cannot resolve host {host!r} ({reason})") from None
    unique = dict.fromkeys((family, sockaddr) for family, _, _, _, sockaddr in found)
    return list(unique)


def _why(error: OSError) -> str:
    if error.errno == errno.EADDRINUSE:
        return "the address is already in use (another pilot, or another program?)"
    if error.errno == errno.EACCES:
        return "permission denied (a port below 1024 needs root or CAP_NET_BIND_SERVICE)"
    if error.errno == errno.EADDRNOTAVAIL:
        return "no interface of this host has that address"
    return f"cannot listen there: {error.strerror or error}"
