"""What a real Envoy on pilot must hold of a test's Services, checked as it changes.

`EnvoyHosts` is the expected view (per Service: each Pod's address and its EDS health,
`HEALTHY` or `DRAINING`) and a presence monitor (tests.support.kube_helpers) that
polls Envoy in the background: `expect` starts a change (only what it keeps must stay
in Envoy meanwhile), `converge` waits for Envoy to hold exactly the new view (all of
it must stay from then on). `assert_never_lost` at the end. `running_envoy` starts the
Envoy, from one of examples/.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from tests.cluster.workloads import SERVICE_PORT, TARGET_PORT, Obj, address
from tests.support.envoy_process import EnvoyProcess, load_example_bootstrap
from tests.support.envoy_view import ClusterView, wait_for_view
from tests.support.kube_helpers import PresenceMonitor, hosts_of
from tests.support.mesh import cluster_name
from tests.support.pilot import RunningPilot

CDS_UPDATES = "cluster_manager.cds.update_success"


def healthy(*pods: Obj) -> dict[str, str]:
    return {address(p): "HEALTHY" for p in pods}


class EnvoyHosts:
    """The Services of `namespace` Envoy must hold, and a monitor of what it holds."""

    def __init__(self, envoy: EnvoyProcess, namespace: str) -> None:
        self.envoy = envoy
        self.namespace = namespace
        self.hosts: dict[str, dict[str, str]] = {}
        self.monitor = PresenceMonitor(envoy, {})

    def view(self) -> ClusterView:
        return {
            cluster_name(name, SERVICE_PORT, self.namespace): {
                (ip, TARGET_PORT): health for ip, health in hosts.items()
            }
            for name, hosts in self.hosts.items()
        }

    def expect(self, what: str, **hosts: dict[str, str] | None) -> None:
        """A change starts (None: a Service goes): from now on only what it keeps must
        stay in Envoy."""
        for name, held in hosts.items():
            if held is None:
                self.hosts.pop(name, None)
            else:
                self.hosts[name] = held
        self.monitor.narrow(hosts_of(self.view()), what)

    async def converge(self, what: str) -> None:
        """Envoy holds exactly the expected view; from now on all of it must stay."""
        await wait_for_view(self.envoy, self.view(), what)
        self.monitor.require(hosts_of(self.view()))

    async def cds_updates(self) -> object:
        return await self.envoy.stat(CDS_UPDATES)


@asynccontextmanager
async def running_envoy(
    pilot: RunningPilot,
    folder: Path,
    example: str,
    name: str = "node-kube",
    locality: dict[str, str] | None = None,
) -> AsyncIterator[EnvoyProcess]:
    """A real Envoy on `pilot`, from one of examples/ (ADS, SotW or delta), declaring
    `locality` when given."""
    bootstrap = load_example_bootstrap(example, pilot.grpc_port, name)
    if locality is not None:
        bootstrap["node"]["locality"] = locality
    (folder / name).mkdir()
    async with EnvoyProcess(bootstrap, folder / name, name, log_level="warning") as envoy:
        yield envoy
