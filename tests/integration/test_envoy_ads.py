"""A real Envoy on an ADS bootstrap (SotW and delta) follows every edit of the registry file.

The last test runs `pilot discovery` itself, with `--cluster-domain`: the clusters Envoy
gets are named in that domain.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.conftest import StartEnvoy
from tests.integration.envoy_ads_expectations import expected
from tests.support.envoy_process import EnvoyProcess, load_example_bootstrap
from tests.support.envoy_view import (
    assert_nothing_rejected_or_warming,
    wait_for_view,
)
from tests.support.mesh import Ep, cluster_name, endpoint_slice, service, simple_mesh, write_mesh
from tests.support.pilot import running_pilot
from tests.support.pilot_process import start_file_pilot_with_ca

ADS_EXAMPLES = ["envoy-ads-sotw.yaml", "envoy-ads-delta.yaml"]


@pytest.mark.parametrize("example", ADS_EXAMPLES)
async def test_envoy_follows_endpoint_and_service_edits(
    tmp_path: Path, start_envoy: StartEnvoy, example: str
) -> None:
    mesh = {"alpha": ["127.0.1.1", "127.0.1.2"], "beta": ["127.0.2.1"], "empty": []}
    async with (
        running_pilot(tmp_path, simple_mesh(mesh)) as pilot,
        start_envoy(pilot, example, "node-a") as envoy,
    ):
        await wait_for_view(envoy, expected(mesh), "initial clusters and hosts")

        mesh["alpha"].append("127.0.1.3")
        pilot.write(simple_mesh(mesh))
        await wait_for_view(envoy, expected(mesh), "an endpoint added")

        mesh["alpha"].remove("127.0.1.1")
        pilot.write(simple_mesh(mesh))
        await wait_for_view(envoy, expected(mesh), "an endpoint removed")

        mesh["gamma"] = ["127.0.3.1", "127.0.3.2"]
        pilot.write(simple_mesh(mesh))
        await wait_for_view(envoy, expected(mesh), "a service added")

        del mesh["beta"]
        pilot.write(simple_mesh(mesh))
        await wait_for_view(envoy, expected(mesh), "a service removed")

        mesh["empty"] = ["127.0.4.1"]
        mesh["alpha"] = []
        pilot.write(simple_mesh(mesh))
        await wait_for_view(envoy, expected(mesh), "a service emptied, another filled")

        await assert_nothing_rejected_or_warming(envoy)


@pytest.mark.parametrize("example", ADS_EXAMPLES)
async def test_envoy_sees_endpoint_conditions_and_merged_slices(
    tmp_path: Path, start_envoy: StartEnvoy, example: str
) -> None:
    objects = [
        service("shop", ports=(("http", 80), ("grpc", 90))),
        endpoint_slice(
            "shop",
            [
                Ep("127.0.5.1", zone="zone-a"),
                Ep("127.0.5.2", ready=False, serving=True, terminating=True, zone="zone-a"),
                Ep("127.0.5.3", ready=False, zone="zone-b"),
            ],
            ports=(("http", 8080), ("grpc", 9090)),
            name="shop-1",
        ),
        endpoint_slice(
            "shop",
            [Ep("127.0.5.1"), Ep("127.0.5.4", ready=None, zone="zone-b")],
            ports=(("http", 8080), ("grpc", 9090)),
            name="shop-2",
        ),
    ]
    hosts = {"127.0.5.1": "HEALTHY", "127.0.5.2": "DRAINING", "127.0.5.4": "HEALTHY"}
    want = {
        cluster_name("shop", 80): {(ip, 8080): h for ip, h in hosts.items()},
        cluster_name("shop", 90): {(ip, 9090): h for ip, h in hosts.items()},
    }
    async with (
        running_pilot(tmp_path, objects) as pilot,
        start_envoy(pilot, example, "node-b") as envoy,
    ):
        await wait_for_view(envoy, want, "ready, draining and merged endpoints")
        await assert_nothing_rejected_or_warming(envoy)


@pytest.mark.parametrize("example", ADS_EXAMPLES)
async def test_broken_file_keeps_the_last_good_state(
    tmp_path: Path, start_envoy: StartEnvoy, example: str
) -> None:
    mesh = {"alpha": ["127.0.1.1"]}
    async with (
        running_pilot(tmp_path, simple_mesh(mesh)) as pilot,
        start_envoy(pilot, example, "node-c") as envoy,
    ):
        await wait_for_view(envoy, expected(mesh), "initial state")
        pilot.config.write_text(
            "kind: List\nitems: [{kind: Service, metadata: {name: x}, spec: {ports: [{port: -1}]}}]"
        )
        await envoy.wait_for(
            lambda: pilot.discovery.source.last_error, 10, "pilot to report the broken file"
        )
        assert "port number" in str(pilot.discovery.source.last_error)
        mesh["alpha"].append("127.0.1.2")
        pilot.write(simple_mesh(mesh))
        await wait_for_view(envoy, expected(mesh), "recovery after the file is fixed")
        await assert_nothing_rejected_or_warming(envoy)


async def test_cluster_domain_names_the_clusters_envoy_gets(tmp_path: Path) -> None:
    """`pilot discovery --cluster-domain example.org`: Envoy's clusters are named like
    `outbound|80||alpha.default.svc.example.org`, each with its endpoints."""
    mesh = {"alpha": ["127.0.1.1"], "beta": ["127.0.2.1", "127.0.2.2"]}
    config = tmp_path / "mesh.yaml"
    write_mesh(config, simple_mesh(mesh))
    pilot = await start_file_pilot_with_ca(tmp_path, config, "--cluster-domain", "example.org")
    try:
        bootstrap = load_example_bootstrap("envoy-ads-delta.yaml", pilot.grpc_port, "node-org")
        async with EnvoyProcess(bootstrap, tmp_path / "envoy", "node-org") as envoy:
            assert "outbound|80||alpha.default.svc.example.org" in expected(mesh, "example.org")
            await wait_for_view(envoy, expected(mesh, "example.org"), "clusters in example.org")
            await assert_nothing_rejected_or_warming(envoy)
    finally:
        await pilot.stop()
