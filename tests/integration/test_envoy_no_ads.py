"""A real Envoy without ADS: clusters from the standalone CDS service, endpoints from EDS.

The last test runs `pilot discovery` itself, with `--xds-cluster-name`: the EDS config
source of every cluster names the bootstrap cluster given.
"""

from __future__ import annotations

from pathlib import Path

from tests.integration.conftest import StartEnvoy
from tests.integration.envoy_ads_expectations import expected
from tests.support.envoy_process import XDS_CLUSTER, EnvoyProcess, Json, load_example_bootstrap
from tests.support.envoy_view import assert_nothing_rejected_or_warming, wait_for_view
from tests.support.mesh import simple_mesh, write_mesh
from tests.support.pilot import running_pilot
from tests.support.pilot_process import start_file_pilot_with_ca


async def test_envoy_without_ads_gets_the_same_clusters_and_follows_edits(
    tmp_path: Path, start_envoy: StartEnvoy
) -> None:
    mesh = {"alpha": ["127.0.1.1", "127.0.1.2"], "beta": ["127.0.2.1"]}
    async with (
        running_pilot(tmp_path, simple_mesh(mesh)) as pilot,
        start_envoy(pilot, "envoy-no-ads.yaml", "node-no-ads") as envoy,
    ):
        await wait_for_view(envoy, expected(mesh), "clusters and hosts over CDS + EDS")
        mesh["alpha"].append("127.0.1.3")
        mesh["gamma"] = ["127.0.3.1"]
        pilot.write(simple_mesh(mesh))
        await wait_for_view(envoy, expected(mesh), "an endpoint and a service added")
        del mesh["beta"]
        pilot.write(simple_mesh(mesh))
        await wait_for_view(envoy, expected(mesh), "a service removed")
        await assert_nothing_rejected_or_warming(envoy)


def _xds_cluster_renamed(bootstrap: Json, name: str) -> Json:
    """The bootstrap with its static cluster to pilot called `name` wherever it is named."""
    (static,) = [c for c in bootstrap["static_resources"]["clusters"] if c["name"] == XDS_CLUSTER]
    static["name"] = static["load_assignment"]["cluster_name"] = name
    (source,) = bootstrap["dynamic_resources"]["cds_config"]["api_config_source"]["grpc_services"]
    source["envoy_grpc"]["cluster_name"] = name
    return bootstrap


async def test_xds_cluster_name_is_the_eds_source_of_every_cluster(tmp_path: Path) -> None:
    """`pilot discovery --xds-cluster-name pilot-xds`, for an Envoy whose bootstrap calls
    its cluster to pilot so: each cluster's EDS config source names that cluster (Envoy
    refuses a cluster naming one it lacks), so the endpoints arrive."""
    mesh = {"alpha": ["127.0.1.1"], "beta": ["127.0.2.1"]}
    config = tmp_path / "mesh.yaml"
    write_mesh(config, simple_mesh(mesh))
    pilot = await start_file_pilot_with_ca(tmp_path, config, "--xds-cluster-name", "pilot-xds")
    try:
        example = load_example_bootstrap("envoy-no-ads.yaml", pilot.grpc_port, "node-renamed")
        bootstrap = _xds_cluster_renamed(example, "pilot-xds")
        workdir, name = tmp_path / "envoy", "node-renamed"
        async with EnvoyProcess(bootstrap, workdir, name, log_level="warning") as envoy:
            # Every cluster Envoy has: pilot's, and the static one to pilot itself.
            static = {"pilot-xds": {("127.0.0.1", pilot.grpc_port): "HEALTHY"}}
            await wait_for_view(envoy, expected(mesh) | static, "clusters and hosts")
            await assert_nothing_rejected_or_warming(envoy)
            for held in (await envoy.dynamic_active_clusters()).values():
                source = held["cluster"]["eds_cluster_config"]["eds_config"]["api_config_source"]
                (service,) = source["grpc_services"]
                assert service["envoy_grpc"]["cluster_name"] == "pilot-xds", held
    finally:
        await pilot.stop()
