"""Faults of the Kubernetes API server never cost a real Envoy an endpoint that still exists.

Each test runs pilot against the test API server with a real Envoy (SotW and delta ADS)
and a background monitor polling Envoy's clusters. Watches are cut, history is
compacted under pilot's feet (410: relist), lists fail for a while, the API server goes
away for seconds, while services and endpoints change. Throughout, every endpoint that
exists both before and after a change stays in Envoy; afterwards Envoy holds exactly
what the API server holds.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.conftest import StartEnvoy
from tests.kubeapi import KubeAPIServer
from tests.support.envoy_process import EnvoyProcess, wait_until
from tests.support.envoy_view import assert_nothing_rejected_or_warming, wait_for_view
from tests.support.kube_helpers import (
    KubeMesh,
    MeshDriver,
    informers,
    kube_api,
    list_requests,
    ready,
    ready_status,
    relists,
)
from tests.support.mesh import Ep
from tests.support.pilot import RunningPilot, running_kube_pilot

ADS_EXAMPLES = ["envoy-ads-sotw.yaml", "envoy-ads-delta.yaml"]
# Every informer pilot runs against this server.
KINDS = (
    "Service",
    "EndpointSlice",
    "Node",
    "Pod",
    "PeerAuthentication",
    "AuthorizationPolicy",
    "RequestAuthentication",
)
API_DOWN_FOR = 2.0  # seconds the API server stays away (holding a fault, not waiting)
FAILED_LISTS = 6  # list attempts each informer makes against failing lists


def initial_mesh() -> KubeMesh:
    return {
        "alpha": ready("127.0.1.1", "127.0.1.2", "127.0.1.3"),
        "beta": ready("127.0.2.1", "127.0.2.2"),
        "steady": ready("127.0.9.1", "127.0.9.2"),
    }


@dataclass
class Converged:
    """The test API server, its mesh, pilot watching it and an Envoy holding its state."""

    srv: KubeAPIServer
    mesh: MeshDriver
    pilot: RunningPilot
    envoy: EnvoyProcess


@asynccontextmanager
async def converged(
    tmp_path: Path, start_envoy: StartEnvoy, example: str, node: str
) -> AsyncIterator[Converged]:
    """pilot on the test API server holding `initial_mesh`, and an Envoy holding it too."""
    async with kube_api(tmp_path) as (srv, kubeconfig):
        mesh = MeshDriver(srv, initial_mesh())
        async with (
            running_kube_pilot(kubeconfig) as pilot,
            start_envoy(pilot, example, node) as envoy,
        ):
            await mesh.converge([envoy], "the initial state")
            yield Converged(srv, mesh, pilot, envoy)


class ListTimes:
    """A predicate for `KubeAPIServer.wait_until` (re-checked on every request) that
    timestamps the list requests of each kind as they arrive."""

    def __init__(self, srv: KubeAPIServer, enough: int) -> None:
        self.srv = srv
        self.enough = enough
        self.start = list_requests(srv, *KINDS)
        self.times: dict[str, list[float]] = {kind: [] for kind in KINDS}

    def __call__(self) -> bool:
        now = asyncio.get_running_loop().time()
        for kind, count in list_requests(self.srv, *KINDS).items():
            seen = self.times[kind]
            seen.extend([now] * (count - self.start[kind] - len(seen)))
        return all(len(seen) >= self.enough for seen in self.times.values())

    def gaps(self, kind: str) -> list[float]:
        seen = self.times[kind]
        return [later - earlier for earlier, later in itertools.pairwise(seen)]


@pytest.mark.parametrize("example", ADS_EXAMPLES)
async def test_dropped_watches_resume_without_relisting(
    tmp_path: Path, start_envoy: StartEnvoy, example: str
) -> None:
    async with converged(tmp_path, start_envoy, example, "node-drop") as up:
        srv, mesh, pilot, envoy = up.srv, up.mesh, up.pilot, up.envoy
        lists = list_requests(srv, *KINDS)
        restarts = {i.kind: i.watch_restarts for i in informers(pilot)}
        async with mesh.monitor(envoy) as monitor:
            # Cut every watch like a crashed server would, and change things before
            # pilot is back: it must pick the changes up from where it was.
            srv.drop_watches(abrupt=True)
            mesh.edit(
                "watches cut",
                alpha=ready("127.0.1.2", "127.0.1.3", "127.0.1.4"),
                gamma=ready("127.0.3.1"),
            )
            await srv.wait_for_watches(len(KINDS))
            await mesh.converge([envoy], "the changes made while no watch was open")

            # A server-side end of the watch (its timeout): same, without an error.
            srv.drop_watches(abrupt=False)
            mesh.edit("watches ended", beta=ready("127.0.2.2"), gamma=None)
            await srv.wait_for_watches(len(KINDS))
            await mesh.converge([envoy], "the changes made after the watches ended")

        await monitor.assert_never_lost()
        assert list_requests(srv, *KINDS) == lists, "pilot listed again after a dropped watch"
        assert relists(pilot) == dict.fromkeys(KINDS, 0)
        assert all(i.watch_restarts > restarts[i.kind] for i in informers(pilot))
        await assert_nothing_rejected_or_warming(envoy)


@pytest.mark.parametrize("example", ADS_EXAMPLES)
async def test_expired_resource_version_relists_and_converges(
    tmp_path: Path, start_envoy: StartEnvoy, example: str
) -> None:
    async with converged(tmp_path, start_envoy, example, "node-410") as up:
        srv, mesh, pilot, envoy = up.srv, up.mesh, up.pilot, up.envoy
        async with mesh.monitor(envoy) as monitor:
            # Changes, then every watch ends with 410 Expired.
            lists = list_requests(srv, *KINDS)
            mesh.edit(
                "changes just before 410",
                alpha=ready("127.0.1.1", "127.0.1.3", "127.0.1.4"),
                gamma=ready("127.0.3.1", "127.0.3.2"),
            )
            srv.expire_watches()
            await srv.wait_until(lambda: relists(pilot) == dict.fromkeys(KINDS, 1))
            await mesh.converge([envoy], "the state after the first relist")

            # Changes pilot can only learn by listing: made while its watches are
            # gone, then the history compacted so that resuming gets 410.
            srv.drop_watches(abrupt=True)
            mesh.edit(
                "changes hidden by compaction",
                alpha=[Ep("127.0.1.1"), Ep("127.0.1.3", ready=False), Ep("127.0.1.5")],
                beta=ready("127.0.2.1", "127.0.2.2", "127.0.2.3"),
                gamma=None,
            )
            srv.compact()
            await srv.wait_until(lambda: relists(pilot) == dict.fromkeys(KINDS, 2))
            await mesh.converge([envoy], "the state after relisting a compacted history")

        await monitor.assert_never_lost()
        assert all(n >= lists[kind] + 2 for kind, n in list_requests(srv, *KINDS).items())
        await assert_nothing_rejected_or_warming(envoy)


@pytest.mark.parametrize("example", ADS_EXAMPLES)
async def test_failing_lists_keep_the_last_state_until_a_list_succeeds(
    tmp_path: Path, start_envoy: StartEnvoy, example: str
) -> None:
    async with converged(tmp_path, start_envoy, example, "node-lists") as up:
        srv, mesh, pilot, envoy = up.srv, up.mesh, up.pilot, up.envoy
        served = mesh.expected()
        async with mesh.monitor(envoy) as monitor:
            # Pilot must list (410) but every list fails.
            srv.fail_lists()
            srv.drop_watches(abrupt=True)
            mesh.edit(
                "lists failing",
                alpha=ready("127.0.1.2", "127.0.1.9"),
                beta=None,
                gamma=ready("127.0.3.1"),
            )
            srv.compact()
            attempts = ListTimes(srv, FAILED_LISTS)
            await srv.wait_until(attempts, timeout=10.0)

            # Retries back off: spaced out, and further apart as failures go on.
            for kind in KINDS:
                gaps = attempts.gaps(kind)
                assert min(gaps) >= 0.01, (kind, gaps)
                assert gaps[-1] > gaps[0], (kind, gaps)
            # Still ready, and a newly connecting Envoy gets the last state pilot had.
            assert await ready_status(pilot.http_port) == 200
            async with start_envoy(pilot, example, "node-late") as late:
                await wait_for_view(late, served, "the last state pilot had")

                srv.fail_lists(0)
                await mesh.converge([envoy, late], "the state once lists succeed")
                await assert_nothing_rejected_or_warming(late)

        await monitor.assert_never_lost()
        # An informer whose objects did not change (Nodes) lists again on its own
        # backoff, maybe after the others have converged: wait for it, bounded.
        await wait_until(
            lambda: relists(pilot),
            what="every informer listing again",
            until=lambda counts: all(n >= 1 for n in counts.values()),
        )
        await assert_nothing_rejected_or_warming(envoy)


@pytest.mark.parametrize("example", ADS_EXAMPLES)
async def test_api_server_restart_keeps_endpoints_and_converges(
    tmp_path: Path, start_envoy: StartEnvoy, example: str
) -> None:
    async with converged(tmp_path, start_envoy, example, "node-restart") as up:
        srv, mesh, pilot, envoy = up.srv, up.mesh, up.pilot, up.envoy
        port = srv.port
        async with mesh.monitor(envoy) as monitor:
            await srv.stop()
            mesh.edit(
                "API server down",
                alpha=ready("127.0.1.1", "127.0.1.2", "127.0.1.3", "127.0.1.4"),
                beta=ready("127.0.2.2"),
                gamma=ready("127.0.3.1", "127.0.3.2"),
            )
            samples = monitor.samples
            await asyncio.sleep(API_DOWN_FOR)  # hold the outage
            assert monitor.samples > samples + 10, "the monitor kept looking meanwhile"
            assert await ready_status(pilot.http_port) == 200

            await srv.start()
            assert srv.port == port
            await mesh.converge([envoy], "the changes made while the API server was down")

        await monitor.assert_never_lost()
        await assert_nothing_rejected_or_warming(envoy)
