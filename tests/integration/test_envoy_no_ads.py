"""A real Envoy without ADS: clusters from the standalone CDS service, endpoints from EDS."""

from __future__ import annotations

from pathlib import Path

from tests.integration.conftest import StartEnvoy
from tests.integration.envoy_view import assert_nothing_rejected_or_warming, wait_for_view
from tests.integration.test_envoy_ads import expected
from tests.support.mesh import simple_mesh
from tests.support.pilot import running_pilot


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
