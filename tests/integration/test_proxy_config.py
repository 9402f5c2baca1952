"""`pilot proxy-config` and `pilot proxy-status -o`, run as a user runs them.

`pilot discovery --config examples/mesh.yaml` (a subprocess, ephemeral ports,
a plugged-in CA) serves a real Envoy that asks over delta ADS for every
cluster, their endpoints and the `default` and `ROOTCA` secrets (an mTLS
listener's). Once `pilot proxy-status -o json` says that Envoy has ACKed all
of it, `pilot proxy-config clusters|endpoints|secrets NODE_ID` prints, in each
of `-o table|json|yaml`, what that Envoy holds: the example mesh's five
clusters at the versions Envoy reports, their endpoints with the addresses,
health and zones of examples/mesh.yaml and of Envoy's /clusters, and the
secrets' certificates with the SPIFFE SAN, serial and expiry Envoy's /certs
shows; never a private key, nor any PEM. A node id pilot does not know is a
one-line error and exit status 1.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.integration.envoy_tls_view import ca_certs, wait_for_own_cert
from tests.integration.mtls_bootstraps import server_bootstrap
from tests.support.cli import Output, assert_formats_agree, run_pilot
from tests.support.envoy_process import EnvoyProcess, wait_until
from tests.support.pilot_process import PilotProcess, start_file_pilot_with_ca
from tests.support.proxies import Proxy

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.envoy]

ROOT = Path(__file__).resolve().parents[2]
MESH = ROOT / "examples" / "mesh.yaml"
PROXY = Proxy.sidecar("reader-1", "shop", "reader")
SYNC_TIMEOUT = 30.0

FRONTEND = "outbound|80||frontend.default.svc.cluster.local"
REVIEWS_HTTP = "outbound|9080||reviews.default.svc.cluster.local"
REVIEWS_GRPC = "outbound|9090||reviews.default.svc.cluster.local"
CART = "outbound|8000||cart.shop.svc.cluster.local"
PAYMENTS = "outbound|443||payments.shop.svc.cluster.local"
CLUSTERS = {FRONTEND, REVIEWS_HTTP, REVIEWS_GRPC, CART, PAYMENTS}
# examples/mesh.yaml as endpoints: (cluster, address:port, health, locality). Ready is
# HEALTHY, serving-but-terminating DRAINING, not ready left out; localities as Istio
# writes them (region/zone: the file has no Nodes, so the region is the cluster id,
# Kubernetes); the legacy Endpoints object has no zone.
ENDPOINTS = {
    (FRONTEND, "127.0.0.1:18080", "HEALTHY", "Kubernetes/zone-a"),
    (FRONTEND, "127.0.0.2:18080", "HEALTHY", "Kubernetes/zone-b"),
    (REVIEWS_HTTP, "127.0.0.1:19080", "HEALTHY", "Kubernetes/zone-a"),
    (REVIEWS_HTTP, "127.0.0.3:19080", "DRAINING", "Kubernetes/zone-a"),
    (REVIEWS_GRPC, "127.0.0.1:19090", "HEALTHY", "Kubernetes/zone-a"),
    (REVIEWS_GRPC, "127.0.0.3:19090", "DRAINING", "Kubernetes/zone-a"),
    (CART, "127.0.0.1:18000", "HEALTHY", "Kubernetes/zone-a"),
    (CART, "127.0.0.2:18000", "HEALTHY", "Kubernetes/zone-b"),
    (PAYMENTS, "127.0.0.1:18443", "HEALTHY", "Kubernetes"),
}
FORMATS = ("table", "json", "yaml")


@dataclass
class Mesh:
    pilot: PilotProcess
    envoy: EnvoyProcess

    @property
    def addr(self) -> str:
        return self.pilot.target(tls=False)

    async def proxy_config(self, kind: str, *extra: str) -> dict[str, Output]:
        """`pilot proxy-config KIND NODE_ID --addr ... -o FORMAT` in every format."""
        commands = [
            run_pilot("proxy-config", kind, PROXY.node_id, "--addr", self.addr, *extra, "-o", f)
            for f in FORMATS
        ]
        return dict(zip(FORMATS, await asyncio.gather(*commands), strict=True))

    async def proxy_status(self, output: str) -> Output:
        return await run_pilot("proxy-status", "--addr", self.addr, "-o", output)


def _all_synced(records: list[dict[str, Any]]) -> bool:
    mine = [record for record in records if record["name"] == PROXY.node_id]
    return len(mine) == 1 and (mine[0]["cds"], mine[0]["eds"], mine[0]["sds"]) == (
        "SYNCED (5)",
        "SYNCED (5)",
        "SYNCED (2)",
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Mesh]:
    """pilot on the example mesh and one Envoy holding all of it, ACKed."""
    folder = tmp_path_factory.mktemp("proxy-config")
    pilot = await start_file_pilot_with_ca(folder, MESH)
    try:
        # The bootstrap's backend cluster is static and never dialled: any port will do.
        bootstrap = server_bootstrap(
            pilot.grpc_port, PROXY, backend_port=pilot.http_port, example="envoy-ads-delta.yaml"
        )
        async with EnvoyProcess(
            bootstrap, folder / "envoy", "reader", log_level="warning"
        ) as envoy:
            await wait_for_own_cert(envoy, PROXY.uri)
            running = Mesh(pilot, envoy)

            async def status() -> list[dict[str, Any]]:
                return (await running.proxy_status("json")).records()

            await wait_until(status, SYNC_TIMEOUT, "proxy-status: all SYNCED", until=_all_synced)
            yield running
    finally:
        await pilot.stop()


async def test_proxy_status_prints_each_format(mesh: Mesh) -> None:
    outputs = {output: await mesh.proxy_status(output) for output in FORMATS}
    headers = ["NAME", "IDENTITY", "CDS", "LDS", "EDS", "RDS", "SDS"]
    records = assert_formats_agree(outputs, headers)
    assert [r for r in records if r["name"] == PROXY.node_id] == [
        {
            "name": PROXY.node_id,
            "identity": PROXY.uri,
            "cds": "SYNCED (5)",
            "lds": None,  # this Envoy asks for clusters and secrets, no listener
            "eds": "SYNCED (5)",
            "rds": None,
            "sds": "SYNCED (2)",
        }
    ]


async def test_clusters_are_the_meshs_at_the_versions_envoy_holds(mesh: Mesh) -> None:
    outputs = await mesh.proxy_config("clusters")
    records = assert_formats_agree(
        outputs, ["NAME", "SUBSET", "TYPE", "LB", "POLICY", "STATUS", "VERSION", "ERROR"]
    )
    held = await mesh.envoy.dynamic_active_clusters()
    assert set(held) == CLUSTERS
    expected = [
        {
            "name": name,
            "subset": None,  # examples/mesh.yaml has no DestinationRule
            "type": "EDS",
            "lb": "LEAST_REQUEST",  # Istio's default with no DestinationRule
            "policy": f"connect={held[name]['cluster']['connect_timeout']}",  # no rule: only that
            "status": "SYNCED",
            "version": held[name]["version_info"],
            "error": None,
        }
        for name in sorted(CLUSTERS)
    ]
    assert records == expected
    policies = {name: held[name]["cluster"].get("lb_policy") for name in CLUSTERS}
    assert set(policies.values()) == {"LEAST_REQUEST"}, f"Envoy holds {policies}"


def _envoy_endpoints(clusters: dict[str, Any]) -> set[tuple[str, str, str, str | None]]:
    """Envoy's /clusters hosts of pilot's clusters as (cluster, address:port, health,
    region/zone)."""
    found = set()
    for status in clusters.get("cluster_statuses", []):
        if status["name"] not in CLUSTERS:
            continue
        for host in status.get("host_statuses", []):
            socket = host["address"]["socket_address"]
            locality = host.get("locality", {})
            zone = "/".join(p for p in (locality.get("region"), locality.get("zone")) if p)
            health = host["health_status"]["eds_health_status"]
            found.add((status["name"], f"{socket['address']}:{socket['port_value']}", health, zone))
    return found


async def test_endpoints_are_the_meshs_as_envoy_holds_them(mesh: Mesh) -> None:
    outputs = await mesh.proxy_config("endpoints")
    headers = ["ENDPOINT", "STATUS", "CLUSTER", "LOCALITY", "PRIORITY", "WEIGHT", "ERROR"]
    records = assert_formats_agree(outputs, headers)
    shown_rows = {(r["cluster"], r["endpoint"], r["status"], r["locality"]) for r in records}
    assert len(shown_rows) == len(records), "an endpoint printed twice"
    assert shown_rows == ENDPOINTS
    in_envoy = _envoy_endpoints(await mesh.envoy.clusters())
    assert shown_rows == in_envoy


async def test_secrets_show_the_certificates_envoy_holds_and_no_key(mesh: Mesh) -> None:
    outputs = await mesh.proxy_config("secrets")
    for output in outputs.values():
        assert "PRIVATE KEY" not in output.stdout + output.stderr, "a private key is shown"
        assert "-----BEGIN" not in output.stdout, "PEM is shown"
    headers = ["RESOURCE NAME", "TYPE", "STATUS", "SAN", "VALID CERT", "SERIAL NUMBER"]
    records = assert_formats_agree(outputs, [*headers, "NOT AFTER", "NOT BEFORE", "ERROR"])
    by_name = {record["resource_name"]: record for record in records}
    assert sorted(by_name) == ["ROOTCA", "default"] and len(records) == 2, records
    workload, root = by_name["default"], by_name["ROOTCA"]
    own = await wait_for_own_cert(mesh.envoy, PROXY.uri)
    assert workload["type"] == "Cert Chain"
    assert workload["san"] == PROXY.uri
    assert int(workload["serial_number"], 16) == own.serial
    assert _parsed(workload["not_after"]) == own.expires
    assert _parsed(workload["not_before"]) < datetime.datetime.now(datetime.UTC)
    assert (workload["status"], workload["valid_cert"]) == ("SYNCED", True)
    [trusted] = await ca_certs(mesh.envoy)
    assert root["type"] == "CA"
    assert int(root["serial_number"], 16) == trusted.serial
    assert _parsed(root["not_after"]) == trusted.expires
    assert (root["status"], root["valid_cert"]) == ("SYNCED", True)


def _parsed(moment: str) -> datetime.datetime:
    return datetime.datetime.strptime(moment, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)


async def test_an_unknown_proxy_is_a_one_line_error(mesh: Mesh) -> None:
    for kind in ("clusters", "endpoints", "secrets"):
        output = await run_pilot(
            "proxy-config", kind, "no-such-proxy", "--addr", mesh.addr, "-o", "json"
        )
        assert output.returncode == 1, str(output)
        assert output.stdout == "", str(output)
        [line] = output.stderr.splitlines()
        assert line.startswith(f"pilot: error: {mesh.addr}: no proxy with node id 'no-such-proxy'")
