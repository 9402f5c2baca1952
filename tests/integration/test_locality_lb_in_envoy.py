"""A DestinationRule's localityLbSetting, carried by a real Envoy to real backends.

`pilot discovery --config FILE` (a subprocess) serves an Envoy started from
`examples/envoy-sidecar-local.yaml` (INTERCEPTION_MODE NONE: its outbound listener
binds 127.0.0.1:PORT), declaring the locality `Kubernetes/zone-a` (the local cluster's
id is the region of endpoints without Nodes). Service `web` has a backend in zone-a
and one in zone-b of the local cluster, and one in each of the clusters `west` and
`east` (documents of the file naming them: their regions), each answering its name.

- No DestinationRule (Istio's default: no locality failover without outlier
  detection): every backend gets requests.
- `distribute` from zone-a 80% to zone-a, 20% to zone-b: over 400 requests zone-a
  answers within a few per cent of 80%, zone-b of 20%, the other regions never.
- `failover` from Kubernetes to west with outlier detection, zone-b left out and
  zone-a answering 503: once outlier detection ejects zone-a, west answers every
  request and east (another region, past the failover target) none.

Envoy rejects nothing throughout.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.envoy_listener_client import free_port
from tests.integration.http_backend import Answer, Backend
from tests.support.cli import run_pilot
from tests.support.envoy_process import EnvoyProcess, load_example_bootstrap, wait_until
from tests.support.envoy_view import assert_nothing_rejected_or_warming
from tests.support.mesh import Ep, endpoint_slice, service, write_mesh
from tests.support.pilot_process import PilotProcess, start_file_pilot_with_ca

pytestmark = [pytest.mark.envoy]

NODE_ID = "sidecar~127.0.0.1~client.default~default.svc.cluster.local"
LOCAL = "Kubernetes"
HOST = "web.default.svc.cluster.local"
TIMEOUT = 30.0
REQUESTS = 400
TOLERANCE = 0.07  # +-7 points: over 4 standard deviations of 400 draws at 20%
ADDRESSES = {"zone-a": "127.0.8.1", "zone-b": "127.0.8.2", "west": "127.0.8.3", "east": "127.0.8.4"}


@dataclass
class Web:
    """The service's port, its backends' common target port, and the registry file."""

    port: int
    target: int
    config: Path

    def write(
        self, rule: dict[str, Any] | None, places: tuple[str, ...] = tuple(ADDRESSES)
    ) -> None:
        """web with a backend at each of `places`, and `rule` as its DestinationRule."""
        ports = [("http", self.target)]

        def slice_of(*names: str) -> dict[str, Any]:
            chosen = [n for n in names if n in places]
            endpoints = [Ep(ADDRESSES[n], zone=n if n.startswith("zone") else "") for n in chosen]
            return endpoint_slice("web", endpoints, ports=ports)

        local = [service("web", ports=[("http", self.port)]), slice_of("zone-a", "zone-b")]
        others = {
            region: [service("web", ports=[("http", self.port)]), slice_of(region)]
            for region in ("west", "east")
        }
        write_mesh(self.config, [*local, *([rule] if rule else [])], others)


def rule(traffic_policy: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.istio.io/v1",
        "kind": "DestinationRule",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"host": "web", "trafficPolicy": traffic_policy},
    }


DISTRIBUTE = rule(
    {
        "loadBalancer": {
            "localityLbSetting": {
                "distribute": [
                    {
                        "from": f"{LOCAL}/zone-a/*",
                        "to": {f"{LOCAL}/zone-a/*": 80, f"{LOCAL}/zone-b/*": 20},
                    }
                ]
            }
        }
    }
)
FAILOVER = rule(
    {
        "loadBalancer": {"localityLbSetting": {"failover": [{"from": LOCAL, "to": "west"}]}},
        "outlierDetection": {
            "consecutive5xxErrors": 1,
            "interval": "1s",
            "baseEjectionTime": "5m",
            "maxEjectionPercent": 100,
        },
    }
)


@asynccontextmanager
async def mesh(
    tmp_path: Path, failing: str = ""
) -> AsyncIterator[tuple[Web, EnvoyProcess, PilotProcess]]:
    """The backends (the one at `failing` answering 503), pilot on the file, and the Envoy."""
    target = free_port()
    web = Web(free_port(), target, tmp_path / "mesh.yaml")
    web.write(None)
    async with AsyncExitStack() as stack:
        for name, address in ADDRESSES.items():
            answer = Answer(body=name, status=503 if name == failing else 200)
            await stack.enter_async_context(Backend(address, target, answer=answer))
        pilot: PilotProcess = await start_file_pilot_with_ca(tmp_path, web.config)
        stack.push_async_callback(pilot.stop)
        bootstrap = load_example_bootstrap("envoy-sidecar-local.yaml", pilot.grpc_port, NODE_ID)
        bootstrap["node"]["locality"] = {"region": LOCAL, "zone": "zone-a"}
        envoy = await stack.enter_async_context(
            EnvoyProcess(bootstrap, tmp_path / "envoy", "locality", log_level="warning")
        )
        yield web, envoy, pilot
        await assert_nothing_rejected_or_warming(envoy)


async def answered(port: int, count: int) -> Counter[str]:
    """`count` GETs of web through Envoy's listener, one after another: who answered
    each (its name; a status other than 200: the status)."""
    seen: Counter[str] = Counter()
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for _ in range(count):
            async with session.get(f"http://127.0.0.1:{port}/", headers={"Host": "web"}) as got:
                seen[await got.text() if got.status == 200 else str(got.status)] += 1
    return seen


async def web_localities(envoy: EnvoyProcess, web: Web) -> dict[str, tuple[int, int, int]]:
    """zone (or region) -> (priority, weight, endpoints) of web's assignment in Envoy."""
    assignment = (await envoy.dynamic_endpoint_configs()).get(f"outbound|{web.port}||{HOST}", {})
    found = {}
    for group in assignment.get("endpoints", []):
        where = group.get("locality", {})
        name = where.get("zone") or where.get("region", "")
        weight = group.get("load_balancing_weight", 0)
        found[name] = (group.get("priority", 0), weight, len(group.get("lb_endpoints", [])))
    return found


async def shown_by_proxy_config(pilot: PilotProcess, web: Web) -> None:
    """`pilot proxy-config endpoints|clusters`: each locality's priority and weight, and
    the cluster balancing by them."""
    name = f"outbound|{web.port}||{HOST}"
    target = ["--addr", pilot.target(tls=False), "-o", "json"]
    endpoints = await run_pilot("proxy-config", "endpoints", NODE_ID, *target)
    rows = {(r["locality"], r["priority"], r["weight"]) for r in endpoints.records()
            if r["cluster"] == name}  # fmt: skip
    assert rows == {(f"{LOCAL}/zone-a", 0, 80), (f"{LOCAL}/zone-b", 0, 20)}
    clusters = await run_pilot("proxy-config", "clusters", NODE_ID, *target)
    (row,) = [r for r in clusters.records() if r["name"] == name]
    assert "locality-weighted" in row["policy"]


async def test_without_a_rule_every_locality_gets_requests(tmp_path: Path) -> None:
    async with mesh(tmp_path) as (web, envoy, _):
        flat = {name: (0, 0, 1) for name in ADDRESSES}
        await wait_until(lambda: web_localities(envoy, web), TIMEOUT, "all at 0", until=flat.__eq__)
        seen = await answered(web.port, 200)
        assert set(seen) == set(ADDRESSES), f"every backend answers: {seen}"


async def test_distribute_80_20_within_a_few_per_cent(tmp_path: Path) -> None:
    async with mesh(tmp_path) as (web, envoy, pilot):
        web.write(DISTRIBUTE)
        # west and east are sent with no endpoint (as istiod sends them): Envoy drops them.
        weighted = {"zone-a": (0, 80, 1), "zone-b": (0, 20, 1)}
        await wait_until(
            lambda: web_localities(envoy, web), TIMEOUT, "80/20", until=weighted.__eq__
        )
        seen = await answered(web.port, REQUESTS)
        assert set(seen) <= {"zone-a", "zone-b"}, f"no other region: {seen}"
        await shown_by_proxy_config(pilot, web)
        assert abs(seen["zone-a"] / REQUESTS - 0.8) <= TOLERANCE, seen
        assert abs(seen["zone-b"] / REQUESTS - 0.2) <= TOLERANCE, seen


async def test_failover_to_the_named_region_when_local_hosts_are_ejected(tmp_path: Path) -> None:
    async with mesh(tmp_path, failing="zone-a") as (web, envoy, _):
        web.write(FAILOVER, places=("zone-a", "west", "east"))
        ordered = {"zone-a": (0, 1, 1), "west": (1, 1, 1), "east": (2, 1, 1)}
        await wait_until(
            lambda: web_localities(envoy, web), TIMEOUT, "zone-a, west, east", until=ordered.__eq__
        )
        # The first 503 ejects zone-a's host (consecutive5xxErrors 1; Istio's default
        # retry may already carry that request to west).
        await answered(web.port, 3)
        seen = await answered(web.port, 100)
        assert seen == Counter({"west": 100}), f"all to the failover region: {seen}"
