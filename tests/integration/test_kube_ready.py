"""Pilot's `/ready` while the API server's lists fail, and what `--namespaces` asks for.

On the test API server, for what a real one cannot be made to do or show: its lists
failing on purpose, and the requests pilot sent. `/ready` (on pilot's HTTP port) answers
200 once every informer has its first list, and not before: a pilot started while the
API server's lists fail stays 503, and gives an Envoy that connects meanwhile nothing
(no partial mesh), until a list succeeds. A pilot told to watch namespace `a` never
asks for, holds or serves anything of namespace `b`. (Ready on a real API server, and
holding nothing of a namespace it does not watch: tests/cluster.)
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from pilot.app import Core, start_discovery
from pilot.kube.config import KubernetesSettings
from tests.integration.conftest import StartEnvoy
from tests.support.envoy_process import wait_until
from tests.support.envoy_view import (
    assert_nothing_rejected_or_warming,
    dynamic_clusters,
    wait_for_view,
)
from tests.support.kube_helpers import (
    MeshDriver,
    kube_api,
    list_requests,
    ready,
    ready_status,
)
from tests.support.pilot import FAST_INFORMER, RunningPilot, _settings, running_kube_pilot

KINDS = ("Service", "EndpointSlice")


async def test_not_ready_while_the_first_lists_fail(
    tmp_path: Path, start_envoy: StartEnvoy
) -> None:
    async with kube_api(tmp_path) as (srv, kubeconfig):
        mesh = MeshDriver(srv, {"alpha": ready("127.0.1.1")})
        srv.fail_lists()  # every list fails until fail_lists(0)
        kubernetes = KubernetesSettings(kubeconfig, informer=FAST_INFORMER)
        core = Core(_settings(tmp_path / "ca", kubernetes=kubernetes))
        starting = asyncio.create_task(start_discovery(core), name="pilot-start")
        try:
            await srv.wait_until(
                lambda: all(n >= 3 for n in list_requests(srv, *KINDS).values()), timeout=10.0
            )
            discovery = core.discovery  # built: the informers list
            assert discovery is not None
            port = discovery.http.port  # serving since before the first list
            statuses = [await ready_status(port) for _ in range(5)]
            assert statuses == [503] * 5
            assert not starting.done(), "start() returned before the registry synced"
            assert not discovery.is_ready()

            async with start_envoy(
                RunningPilot(discovery), "envoy-ads-delta.yaml", "early"
            ) as envoy:
                # Envoy has reached pilot's xDS port, and gets nothing yet.
                await envoy.wait_for_stat("cluster.xds-grpc.upstream_cx_total", lambda n: n)
                assert await dynamic_clusters(envoy) == {}
                assert await envoy.ready() == 503, "Envoy initialized on a partial mesh"
                srv.fail_lists(0)
                await wait_until(
                    lambda: ready_status(port), 10.0, "/ready to answer 200", until=(200).__eq__
                )
                async with asyncio.timeout(10.0):
                    await starting
                assert {key.name for key in discovery.index.services} == {"alpha"}
                await wait_for_view(envoy, mesh.expected(), "the mesh once pilot is ready")
        finally:
            starting.cancel()  # a start cut short stops what it had started
            with contextlib.suppress(asyncio.CancelledError):
                await (await starting).stop()


async def test_namespaces_limit_what_pilot_sees(tmp_path: Path, start_envoy: StartEnvoy) -> None:
    async with kube_api(tmp_path) as (srv, kubeconfig):
        for name in ("a", "b"):
            srv.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        in_a = MeshDriver(
            srv, {"web": ready("127.0.1.1"), "api": ready("127.0.1.2")}, namespace="a"
        )
        in_b = MeshDriver(srv, {"web": ready("127.0.2.1"), "db": ready("127.0.2.2")}, namespace="b")
        async with (
            running_kube_pilot(kubeconfig, namespaces=("a",)) as pilot,
            start_envoy(pilot, "envoy-ads-delta.yaml", "node-ns") as envoy,
        ):
            await in_a.converge([envoy], "the services of namespace a only")

            # Namespace b changes first; only a's change may ever show.
            in_b.edit("b changes", web=ready("127.0.2.1", "127.0.2.9"), cache=ready("127.0.2.3"))
            in_a.edit("a changes", cache=ready("127.0.1.3"))
            await in_a.converge([envoy], "namespace a's new service, nothing of b")

            assert {key.namespace for key in pilot.discovery.index.services} == {"a"}
            asked = {r.path for kind in KINDS for r in srv.requests_for(kind)}
            assert asked == {
                "/api/v1/namespaces/a/services",
                "/apis/discovery.k8s.io/v1/namespaces/a/endpointslices",
            }
            await assert_nothing_rejected_or_warming(envoy)
