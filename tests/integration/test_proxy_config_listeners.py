"""`pilot proxy-config listeners|routes` and `pilot proxy-status`, run as a user runs them.

`pilot discovery` (a subprocess, ephemeral ports) serves a registry file with
an HTTP service (reviews) and a TCP one (db), each with a ClusterIP. Two proxies
hold its listeners and routes: a real Envoy on the sidecar bootstrap of the
README (`INTERCEPTION_MODE: NONE`: each listener binds 127.0.0.1 on its service
port), and a captured (REDIRECT) sidecar, an xDS client on delta ADS that ACKs
what it gets, since a real one would bind 15001 on this shared machine. Once
proxy-status says both are SYNCED, `pilot proxy-config listeners` prints, in
each of `-o table|json|yaml`, the listeners Envoy holds, a row per filter
chain in istioctl's words (`Route: PORT`, `Cluster: outbound|...`,
`0.0.0.0 15001 ALL PassthroughCluster`), and `routes` the virtual hosts with
their domains shortened as istioctl does. The /debug page and /debug/syncz
show LDS and RDS beside CDS, EDS and SDS, /debug/config_dump the listeners and
routes themselves.

Hostile input: a proxy whose node id carries terminal escapes, a newline and
30,000 characters reaches `proxy-status` and `proxy-config` tables escaped,
on one line, and cut short; an error naming it is one line.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pytest
import pytest_asyncio

from tests.integration.envoy_listener_client import free_port
from tests.support.cli import Output, assert_formats_agree, run_pilot
from tests.support.envoy_process import EnvoyProcess, load_example_bootstrap, wait_until
from tests.support.mesh import Ep, endpoint_slice, service, write_mesh
from tests.support.pilot_process import PilotProcess, start_file_pilot_with_ca
from tests.support.xds_client import LISTENER, ROUTE, DeltaStream, XdsClient, node

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.envoy]

LOCAL = "sidecar~127.0.0.1~local.default~default.svc.cluster.local"
CAPTURED = "sidecar~10.1.1.9~captured.default~default.svc.cluster.local"
REVIEWS_IP, DB_IP = "10.96.0.9", "10.96.0.7"
FORMATS = ("table", "json", "yaml")
LISTENER_HEADERS = ["ADDRESSES", "PORT", "MATCH", "DESTINATION", "AUTHZ", "NAME", "STATUS", "ERROR"]
ROUTE_HEADERS = [
    "NAME", "VHOST NAME", "DOMAINS", "MATCH", "DESTINATION", "RETRIES", "TIMEOUT", "STATUS",
    "ERROR",
]  # fmt: skip
ISTIO_RETRIES = (
    "2 on connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes; another host"
)
SYNC_TIMEOUT = 30.0
HOSTILE = "sidecar~\x1b[2J\x1b]0;owned\x07~x\nFORGED ROW\u202e"
HUGE = HOSTILE + "y" * 30_000  # past CSDS's 1,024-character node matcher: proxy-status only


@dataclass(frozen=True)
class Ports:
    http: int
    tcp: int

    def cluster(self, name: str, port: int) -> str:
        return f"outbound|{port}||{name}.default.svc.cluster.local"


def _mesh(ports: Ports) -> list[dict[str, Any]]:
    reviews = service("reviews", ports=[("http", ports.http)])
    db = service("db", ports=[("tcp", ports.tcp)])
    reviews["spec"]["clusterIP"], db["spec"]["clusterIP"] = REVIEWS_IP, DB_IP
    return [
        reviews,
        endpoint_slice("reviews", [Ep("127.0.0.1")], ports=[("http", 1)]),
        db,
        endpoint_slice("db", [Ep("127.0.0.1")], ports=[("tcp", 1)]),
    ]


@dataclass
class Proxies:
    pilot: PilotProcess
    envoy: EnvoyProcess
    ports: Ports

    @property
    def addr(self) -> str:
        return self.pilot.target(tls=False)

    async def proxy_config(self, kind: str, node_id: str) -> dict[str, Output]:
        """`pilot proxy-config KIND NODE_ID --addr ... -o FORMAT` in every format."""
        commands = [
            run_pilot("proxy-config", kind, node_id, "--addr", self.addr, "-o", output)
            for output in FORMATS
        ]
        return dict(zip(FORMATS, await asyncio.gather(*commands), strict=True))

    async def status(self) -> dict[str, dict[str, Any]]:
        output = await run_pilot("proxy-status", "--addr", self.addr, "-o", "json")
        return {record["name"]: record for record in output.records()}


async def _hold_routing(stream: DeltaStream, route: str) -> None:
    """As a captured Envoy: every listener, then the route configuration, each ACKed."""
    await stream.subscribe(LISTENER, ["*"])
    await stream.ack(await stream.expect(LISTENER))
    await stream.subscribe(ROUTE, [route])
    await stream.ack(await stream.expect(ROUTE))


def _all_synced(cell: str | None) -> bool:
    return cell is not None and cell.startswith("SYNCED (") and "not sent" not in cell


def _synced(records: dict[str, dict[str, Any]]) -> bool:
    """Both proxies hold listeners and routes, every one ACKed (whatever else pilot adds)."""
    held = [records.get(name, {}) for name in (LOCAL, CAPTURED)]
    return all(_all_synced(record.get(t)) for record in held for t in ("lds", "rds"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def proxies(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Proxies]:
    folder = tmp_path_factory.mktemp("proxy-config-listeners")
    ports = Ports(free_port(), free_port())
    write_mesh(folder / "mesh.yaml", _mesh(ports))
    pilot = await start_file_pilot_with_ca(folder, folder / "mesh.yaml")
    try:
        bootstrap = load_example_bootstrap("envoy-sidecar-local.yaml", pilot.grpc_port, LOCAL)
        async with (
            EnvoyProcess(bootstrap, folder / "envoy", "local", log_level="warning") as envoy,
            XdsClient(pilot.target(tls=False)) as client,
        ):
            captured = client.delta_ads(node(CAPTURED, {"INTERCEPTION_MODE": "REDIRECT"}))
            await _hold_routing(captured, str(ports.http))
            running = Proxies(pilot, envoy, ports)
            await wait_until(running.status, SYNC_TIMEOUT, "LDS and RDS SYNCED", until=_synced)
            yield running
    finally:
        await pilot.stop()


def _rows(records: list[dict[str, Any]], *keys: str) -> list[tuple[Any, ...]]:
    return [tuple(record[key] for key in keys) for record in records]


async def _envoy_listeners(envoy: EnvoyProcess) -> set[str]:
    dump = await envoy.config_dump(resource="dynamic_listeners")
    return {entry["name"] for entry in dump.get("configs", []) if "active_state" in entry}


async def test_listeners_are_the_ones_envoy_holds_a_row_per_chain(proxies: Proxies) -> None:
    ports = proxies.ports
    records = assert_formats_agree(await proxies.proxy_config("listeners", LOCAL), LISTENER_HEADERS)
    keys = ("addresses", "port", "match", "destination", "name", "status")
    http = f"127.0.0.1_{ports.http}", f"Route: {ports.http}"
    tcp = f"127.0.0.1_{ports.tcp}", f"Cluster: {ports.cluster('db', ports.tcp)}"
    expected = [
        ("127.0.0.1", ports.http, "ALL", http[1], http[0], "SYNCED"),
        ("127.0.0.1", ports.tcp, "ALL", tcp[1], tcp[0], "SYNCED"),
    ]
    rows = _rows(records, *keys)
    assert [row for row in rows if row in expected] == sorted(expected, key=lambda r: r[1])
    assert {record["name"] for record in records} == await _envoy_listeners(proxies.envoy)


async def test_a_captured_sidecar_shows_virtual_outbound_and_cluster_ip_listeners(
    proxies: Proxies,
) -> None:
    ports = proxies.ports
    records = assert_formats_agree(
        await proxies.proxy_config("listeners", CAPTURED), LISTENER_HEADERS
    )
    rows = set(_rows(records, "addresses", "port", "match", "destination"))
    assert rows >= {
        ("0.0.0.0", 15001, "ALL", "PassthroughCluster"),
        ("0.0.0.0", ports.http, "ALL", f"Route: {ports.http}"),
        (DB_IP, ports.tcp, "ALL", f"Cluster: {ports.cluster('db', ports.tcp)}"),
    }
    assert [record["port"] for record in records] == sorted(r["port"] for r in records)


async def test_routes_name_the_virtual_hosts_with_short_domains(proxies: Proxies) -> None:
    ports = proxies.ports
    reviews = (
        str(ports.http),
        f"reviews.default.svc.cluster.local:{ports.http}",
        "reviews.default, reviews + 1 more...",
        "/*",
        f"Cluster: {ports.cluster('reviews', ports.http)}",
        ISTIO_RETRIES,
        "SYNCED",
    )
    keys = ("name", "vhost_name", "domains", "match", "destination", "retries", "status")
    local = assert_formats_agree(await proxies.proxy_config("routes", LOCAL), ROUTE_HEADERS)
    assert reviews in _rows(local, *keys)
    assert "allow_any" not in {r["vhost_name"] for r in local}, "no capture: no allow_any host"
    captured = assert_formats_agree(await proxies.proxy_config("routes", CAPTURED), ROUTE_HEADERS)
    allow_any = (str(ports.http), "allow_any", "*", "/*", "PassthroughCluster", "none", "SYNCED")
    mine = [row for row in _rows(captured, *keys) if row[0] == str(ports.http)]
    assert mine == [reviews, allow_any], "the services' hosts, then allow_any"


async def test_proxy_status_and_debug_show_lds_and_rds(proxies: Proxies) -> None:
    output = await run_pilot("proxy-status", "--addr", proxies.addr)
    headers, rows = output.table()
    assert headers == ["NAME", "IDENTITY", "CDS", "LDS", "EDS", "RDS", "SDS"]
    [local] = [row for row in rows if row[0] == LOCAL]
    assert _all_synced(local[3]) and _all_synced(local[5]), local
    status, page = await proxies.pilot.get("/debug/?refresh=0")
    assert status == 200
    assert "<th>LDS</th>" in page and "<th>RDS</th>" in page, page
    syncz = await proxies.pilot.get_json("/debug/syncz")
    [entry] = [e for e in syncz if e["proxy"] == LOCAL]
    assert set(entry["types"]["lds"]) == set(entry["types"]["rds"]) == {"SYNCED"}, entry
    dump = await proxies.pilot.get_json(f"/debug/config_dump?proxyID={quote(LOCAL)}")
    held = {(r["type"], r["name"]) for r in dump["resources"] if r["resource"] is not None}
    http = proxies.ports.http
    assert {(LISTENER, f"127.0.0.1_{http}"), (ROUTE, str(http))} <= held, sorted(held)


def _assert_harmless(text: str) -> None:
    assert not any(ch in text for ch in "\x1b\x07\u202e"), repr(text[:300])
    assert not any(line.lstrip().startswith("FORGED") for line in text.splitlines()), text[:300]


async def test_a_hostile_node_id_reaches_the_terminal_escaped_and_cut_short(
    proxies: Proxies,
) -> None:
    async with XdsClient(proxies.addr) as client:
        for node_id in (HOSTILE, HUGE):
            await _hold_routing(client.delta_ads(node(node_id)), str(proxies.ports.http))
        await wait_until(
            proxies.status,
            SYNC_TIMEOUT,
            "the hostile proxies listed",
            until=lambda records: {HOSTILE, HUGE} <= set(records),
        )
        table = await run_pilot("proxy-status", "--addr", proxies.addr)
        _assert_harmless(table.stdout)
        hostile = [line for line in table.stdout.splitlines() if line.startswith("sidecar~\\x1b")]
        assert len(hostile) == 2, "each proxy on one line"
        assert any("...(+" in row and len(row) < 1500 for row in hostile), "the huge id cut"
        for output in (await proxies.proxy_config("listeners", HOSTILE)).values():
            assert output.returncode == 0, output.stderr
            _assert_harmless(output.stdout)
        assert any("virtualOutbound" in line for line in output.stdout.splitlines())
        errors = {}
        for node_id, status in ((HOSTILE + "z", 1), (HUGE, 2)):
            missing = await run_pilot("proxy-config", "routes", node_id, "--addr", proxies.addr)
            assert (missing.returncode, missing.stdout) == (status, ""), missing.stderr
            [errors[status]] = missing.stderr.splitlines()
            _assert_harmless(errors[status])
            assert len(errors[status]) < 600, errors[status]
        assert "no proxy with node id 'sidecar~\\x1b[2J\\x1b]0;owned\\x07~x\\nFORGED" in errors[1]
        assert "exact longer than 1024 characters" in errors[2], "pilot's bound, said plainly"
