"""What an mTLS Envoy holds, read back from its admin API.

Owns `EnvoyCert` and the readers of `/certs` (its own leaf certificates, its
trust roots, waiting for an identity to show), of `/listeners` (the port a
listener bound), of its listeners' TLS stats, and `assert_envoy_holds`.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from tests.support.envoy_process import EnvoyProcess, Json

STARTUP = 30.0  # seconds an Envoy may take to hold its identity, go LIVE, bind listeners


@dataclass(frozen=True)
class EnvoyCert:
    """One certificate as Envoy's /certs reports it."""

    serial: int
    uris: tuple[str, ...]
    expires: datetime.datetime


def _envoy_cert(entry: Json) -> EnvoyCert:
    uris = tuple(san["uri"] for san in entry.get("subject_alt_names", []) if "uri" in san)
    expires = datetime.datetime.fromisoformat(entry["expiration_time"].replace("Z", "+00:00"))
    return EnvoyCert(int(entry["serial_number"], 16), uris, expires)


async def own_certs(envoy: EnvoyProcess) -> set[EnvoyCert]:
    """The leaf certificates of every TLS context of this Envoy (its own identity)."""
    found: set[EnvoyCert] = set()
    for context in (await envoy.certs()).get("certificates", []):
        for entry in context.get("cert_chain", [])[:1]:
            found.add(_envoy_cert(entry))
    return found


async def ca_certs(envoy: EnvoyProcess) -> set[EnvoyCert]:
    """The trust roots of every TLS context of this Envoy."""
    found: set[EnvoyCert] = set()
    for context in (await envoy.certs()).get("certificates", []):
        found.update(_envoy_cert(entry) for entry in context.get("ca_cert", []))
    return found


async def listener_port(envoy: EnvoyProcess, name: str) -> int:
    """The port a listener bound (listeners ask for port 0)."""
    data = await envoy.admin_json("/listeners", {"format": "json"})
    for status in data.get("listener_statuses", []):
        if status.get("name") == name:
            port = int(status["local_address"]["socket_address"].get("port_value", 0))
            assert port, f"listener {name} has no port yet: {status}"
            return port
    raise AssertionError(f"Envoy {envoy.name} has no listener {name}: {data}")


async def wait_for_own_cert(envoy: EnvoyProcess, uri: str) -> EnvoyCert:
    """Wait until /certs shows a certificate for `uri`; return it."""
    certs = await envoy.wait_for(
        lambda: own_certs(envoy),
        STARTUP,
        f"/certs to show a certificate for {uri}",
        until=lambda found: any(uri in cert.uris for cert in found),
    )
    return next(cert for cert in certs if uri in cert.uris)


async def listener_ssl_stat(envoy: EnvoyProcess, name: str) -> int:
    """The sum of `listener.<address>.ssl.<name>` over every listener of this Envoy."""
    stats = await envoy.stats(regex=rf"^listener\..*\.ssl\.{name}$")
    return sum(value for value in stats.values() if isinstance(value, int))


async def assert_envoy_holds(envoy: EnvoyProcess, serial: int, uri: str, root_serial: int) -> None:
    """/certs shows exactly this leaf (serial, SPIFFE URI) and trusts only this root."""
    mine = await own_certs(envoy)
    assert {(cert.serial, cert.uris) for cert in mine} == {(serial, (uri,))}
    roots = await ca_certs(envoy)
    assert {cert.serial for cert in roots} == {root_serial}
