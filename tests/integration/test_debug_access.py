"""Where the /debug endpoints answer, with the real `pilot discovery --config examples/mesh.yaml`.

On the HTTP port (`--http-addr`) they answer loopback callers only, 403 to anyone
else, while /ready and /metrics answer everyone. `--debug-addr` moves them to a
listener of their own, which answers whoever can reach it (pilot/debug/http.py).

A caller off loopback is this machine calling its own non-loopback address, from
that address (tests/support/addresses.py). Its ports are bound to port 0 and read
back from pilot's log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.addresses import outside_address, url
from tests.support.envoy_process import EXAMPLES_DIR, wait_until
from tests.support.mesh import cluster_name
from tests.support.pilot_process import http_get, start_file_pilot_with_ca
from tests.support.xds_client import CLUSTER, XdsClient, node

MESH = EXAMPLES_DIR / "mesh.yaml"
SERVICES = ["cart", "frontend", "payments", "reviews"]  # what examples/mesh.yaml lists
DEBUG_PATHS = (
    "/debug/syncz",
    "/debug/connections",
    "/debug/registryz",
    "/debug/edsz",
    "/debug/config_dump?proxyID=anyone",
    "/debug/tasks",
    "/debug/pushz",
    "/debug",  # the HTML page
    "/debug/",
)


def _services(registryz: Any) -> list[str]:
    return sorted(service["name"] for service in registryz["services"])


async def test_debug_addr_serves_the_debug_endpoints_on_their_own_port(tmp_path: Path) -> None:
    pilot = await start_file_pilot_with_ca(tmp_path, MESH, "--debug-addr", "127.0.0.1:0")
    try:
        assert pilot.debug_port not in (0, pilot.http_port), "pilot logs the debug port it bound"
        async with XdsClient(pilot.target(tls=False)) as client:
            stream = client.delta_ads(node("debug-addr-proxy"))
            await stream.subscribe(CLUSTER, ["*"])
            await stream.ack_until(CLUSTER, [cluster_name("frontend")])

            async def syncz() -> Any:
                return (await pilot.get("/debug/syncz", port=pilot.debug_port))[1]

            rows = await wait_until(
                syncz, 10, "the proxy in /debug/syncz", until=lambda r: isinstance(r, list) and r
            )
        assert [row["proxy"] for row in rows] == ["debug-addr-proxy"]
        assert "cds" in rows[0]["types"]
        status, registryz = await pilot.get("/debug/registryz", port=pilot.debug_port)
        assert status == 200 and _services(registryz) == SERVICES
        assert await pilot.get("/ready") == (200, "ready\ncluster Kubernetes: synced\n")
        status, metrics = await pilot.get("/metrics")
        assert status == 200 and "\npilot_services 4.0\n" in metrics
        status, _ = await pilot.get("/debug/syncz")
        assert status == 404, "the debug endpoints moved off --http-addr"
    finally:
        await pilot.stop()


async def test_the_http_port_answers_debug_to_loopback_only(tmp_path: Path) -> None:
    outside = outside_address()
    v6 = ":" in outside
    wildcard, loopback = ("[::]", "::1") if v6 else ("0.0.0.0", "127.0.0.1")
    # --xds-auth none binds off loopback only when told to (anyone there gets certificates).
    pilot = await start_file_pilot_with_ca(
        tmp_path, MESH, "--http-addr", f"{wildcard}:0", "--insecure-bind-any"
    )
    try:
        port = pilot.http_port
        for path in DEBUG_PATHS:
            status, body = await http_get(url(outside, port, path), source=outside)
            assert status == 403, f"{path} from {outside}: HTTP {status}"
            assert "loopback only" in body["error"]
        assert await http_get(url(outside, port, "/ready"), source=outside) == (
            200,
            "ready\ncluster Kubernetes: synced\n",
        )
        status, metrics = await http_get(url(outside, port, "/metrics"), source=outside)
        assert status == 200 and "\npilot_services 4.0\n" in metrics
        status, registryz = await http_get(url(loopback, port, "/debug/registryz"), loopback)
        assert status == 200 and _services(registryz) == SERVICES
        status, syncz = await http_get(url(loopback, port, "/debug/syncz"), loopback)
        assert (status, syncz) == (200, [])
    finally:
        await pilot.stop()


async def test_a_debug_addr_off_loopback_answers_whoever_reaches_it(tmp_path: Path) -> None:
    outside = outside_address()
    listen = f"[{outside}]:0" if ":" in outside else f"{outside}:0"
    pilot = await start_file_pilot_with_ca(tmp_path, MESH, "--debug-addr", listen)
    try:
        assert pilot.debug_port not in (0, pilot.http_port)
        registryz_url = url(outside, pilot.debug_port, "/debug/registryz")
        status, registryz = await http_get(registryz_url, source=outside)
        assert status == 200, f"the debug listener refused {outside}: HTTP {status}"
        assert _services(registryz) == SERVICES
    finally:
        await pilot.stop()
