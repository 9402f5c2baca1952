"""A real Envoy follows pilot's Kubernetes registry (SotW and delta ADS).

Pilot watches a test API server through an ordinary kubeconfig. Services are scaled up
and down, added and deleted, endpoints go not-ready (they leave) and terminating but
still serving (DRAINING), and a service dropping to zero endpoints keeps its cluster.
Both endpoint APIs are covered: EndpointSlices and legacy v1 Endpoints. Endpoint-only
changes take the incremental EDS path: Envoy gets no cluster update for them. All the
while Envoy never loses an endpoint that still exists.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pilot.sources.kubernetes.config import EndpointsApi
from pilot.xds import types
from tests.harness.envoy_process import EnvoyProcess
from tests.integration.conftest import StartEnvoy
from tests.integration.envoy_view import assert_nothing_rejected_or_warming, dynamic_clusters
from tests.integration.kube_helpers import MeshDriver, kube_api, ready
from tests.support.mesh import Ep, cluster_name
from tests.support.pilot import RunningPilot, running_kube_pilot

ADS_EXAMPLES = ["envoy-ads-sotw.yaml", "envoy-ads-delta.yaml"]
CDS_UPDATES = "cluster_manager.cds.update_success"
ALPHA, GAMMA = cluster_name("alpha"), cluster_name("gamma")


async def cluster_pushes(pilot: RunningPilot, envoy: EnvoyProcess) -> tuple[object, int]:
    """(CDS updates Envoy accepted, clusters pilot serialized)."""
    return await envoy.stat(CDS_UPDATES), pilot.discovery.stats.serializations[types.CLUSTER]


@pytest.mark.parametrize("example", ADS_EXAMPLES)
@pytest.mark.parametrize(
    "endpoints_api", [EndpointsApi.ENDPOINTSLICES, EndpointsApi.ENDPOINTS], ids=str
)
async def test_envoy_follows_scaling_services_and_endpoint_conditions(
    tmp_path: Path, start_envoy: StartEnvoy, example: str, endpoints_api: EndpointsApi
) -> None:
    legacy = endpoints_api is EndpointsApi.ENDPOINTS
    async with kube_api(tmp_path) as (srv, kubeconfig):
        mesh = MeshDriver(
            srv,
            {"alpha": ready("127.0.1.1", "127.0.1.2"), "beta": ready("127.0.2.1")},
            legacy=legacy,
        )
        async with (
            running_kube_pilot(kubeconfig, endpoints_api=endpoints_api) as pilot,
            start_envoy(pilot, example, "node-kube") as envoy,
        ):
            await mesh.converge([envoy], "the initial services and endpoints")
            async with mesh.monitor(envoy) as monitor:
                before = await cluster_pushes(pilot, envoy)
                mesh.edit("scale up", alpha=ready("127.0.1.1", "127.0.1.2", "127.0.1.3"))
                await mesh.converge([envoy], "alpha scaled up")
                mesh.edit("scale down", alpha=ready("127.0.1.2", "127.0.1.3"))
                await mesh.converge([envoy], "alpha scaled down")
                assert await cluster_pushes(pilot, envoy) == before, "endpoint-only changes"

                mesh.edit("add a service", gamma=ready("127.0.3.1", "127.0.3.2"))
                await mesh.converge([envoy], "gamma added")
                mesh.edit("delete a service", beta=None)
                await mesh.converge([envoy], "beta deleted")
                assert (await dynamic_clusters(envoy)).keys() == {ALPHA, GAMMA}

                before = await cluster_pushes(pilot, envoy)
                # 127.0.1.2 fails its readiness probe; 127.0.1.3 is terminating but still
                # serving (legacy Endpoints cannot say that: it stays plainly ready there).
                draining = Ep("127.0.1.3", ready=False, serving=True, terminating=True)
                alpha = [Ep("127.0.1.2", ready=False), Ep("127.0.1.3") if legacy else draining]
                mesh.edit("not ready / draining", alpha=alpha)
                await mesh.converge([envoy], "a not-ready endpoint gone, a draining one kept")
                assert (await dynamic_clusters(envoy))[ALPHA] == {
                    ("127.0.1.3", 8080): "HEALTHY" if legacy else "DRAINING"
                }
                mesh.edit("ready again", alpha=ready("127.0.1.2"))
                await mesh.converge([envoy], "the not-ready endpoint back, the draining one gone")
                mesh.edit("to zero endpoints", gamma=[])
                await mesh.converge([envoy], "gamma kept as a cluster with no hosts")
                assert (await dynamic_clusters(envoy))[GAMMA] == {}
                assert await cluster_pushes(pilot, envoy) == before, "endpoint-only changes"

            await monitor.assert_never_lost()
            await assert_nothing_rejected_or_warming(envoy)
