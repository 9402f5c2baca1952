"""A real Envoy with listeners and routes from pilot carries HTTP requests by service name.

The Envoy runs `examples/envoy-sidecar-local.yaml` (ADS, delta, `INTERCEPTION_MODE:
NONE`): its outbound listeners bind 127.0.0.1:PORT, so the test connects to them
as a client on the machine would, naming the service in `Host:`. Backends are
real HTTP servers on loopback. A service added is reachable without a restart,
an endpoint removed stops receiving requests, and CSDS shows the listeners and
routes the proxy holds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from pilot.xds import types
from tests.integration.envoy_listener_client import free_port, get
from tests.integration.http_backend import BACKEND_BODY, Backend
from tests.support.envoy_process import EnvoyProcess, load_example_bootstrap, wait_until
from tests.support.envoy_view import assert_nothing_rejected_or_warming
from tests.support.mesh import Ep, endpoint_slice, service
from tests.support.pilot import RunningPilot, running_pilot
from tests.support.xds_client import XdsClient

EXAMPLE = "envoy-sidecar-local.yaml"
NODE_ID = "sidecar~127.0.0.1~client.default~default.svc.cluster.local"
DEADLINE = 20.0


def http_service(name: str, port: int, backend: Backend | None) -> list[dict[str, Any]]:
    """A Service with one HTTP port, its endpoint the backend on 127.0.0.1 (or none)."""
    endpoints = [Ep("127.0.0.1")] if backend is not None else []
    target = backend.port if backend is not None else 1
    return [
        service(name, ports=[("http", port)]),
        endpoint_slice(name, endpoints, ports=[("http", target)]),
    ]


async def answers(port: int, host: str) -> bool:
    try:
        status, body = await get(port, host)
    except aiohttp.ClientError:
        return False
    return status == 200 and body.startswith(BACKEND_BODY)


@asynccontextmanager
async def local_sidecar(pilot: RunningPilot, tmp_path: Path) -> AsyncIterator[EnvoyProcess]:
    bootstrap = load_example_bootstrap(EXAMPLE, pilot.grpc_port, NODE_ID)
    async with EnvoyProcess(
        bootstrap, tmp_path / "envoy", "local-sidecar", log_level="warning"
    ) as envoy:
        yield envoy


async def dynamic_names(envoy: EnvoyProcess) -> tuple[set[str], set[str]]:
    """The listeners and route configurations Envoy holds from xDS."""
    listeners = await envoy.config_dump(resource="dynamic_listeners")
    routes = await envoy.config_dump(resource="dynamic_route_configs")
    return (
        {entry["name"] for entry in listeners.get("configs", []) if "active_state" in entry},
        {entry["route_config"]["name"] for entry in routes.get("configs", [])},
    )


async def test_a_request_by_service_name_reaches_its_backend_through_envoy(
    tmp_path: Path,
) -> None:
    reviews_port, ratings_port = free_port(), free_port()
    async with AsyncExitStack() as stack:
        reviews = await stack.enter_async_context(Backend())
        ratings = await stack.enter_async_context(Backend())
        mesh = http_service("reviews", reviews_port, reviews)
        pilot = await stack.enter_async_context(running_pilot(tmp_path, mesh))
        (tmp_path / "envoy").mkdir()
        envoy = await stack.enter_async_context(local_sidecar(pilot, tmp_path))

        held = await wait_until(
            lambda: dynamic_names(envoy),
            DEADLINE,
            "the listener and route configuration of reviews",
            until=lambda names: (
                f"127.0.0.1_{reviews_port}" in names[0] and str(reviews_port) in names[1]
            ),
        )
        assert "virtualOutbound" not in held[0], "no capture: no virtualOutbound"
        for host in ("reviews", f"reviews.default:{reviews_port}", "reviews.default.svc"):
            await wait_until(lambda h=host: answers(reviews_port, h), DEADLINE, host)
        assert reviews.seen, "the backend saw the requests"
        status, _ = await get(reviews_port, "unknown.example")
        assert status == 404, "a host no service has: no route in no-capture mode"

        pilot.write([*mesh, *http_service("ratings", ratings_port, ratings)])
        await wait_until(
            lambda: answers(ratings_port, f"ratings:{ratings_port}"),
            DEADLINE,
            "a service added, reached without restarting Envoy",
        )

        without = http_service("reviews", reviews_port, None)
        pilot.write([*without, *http_service("ratings", ratings_port, ratings)])
        await wait_until(
            lambda: get(reviews_port, "reviews"),
            DEADLINE,
            "reviews without endpoints",
            until=lambda answer: answer[0] == 503,
        )
        before = len(reviews.seen)
        assert (await get(reviews_port, "reviews"))[0] == 503
        assert len(reviews.seen) == before, "a removed endpoint receives no request"
        await assert_nothing_rejected_or_warming(envoy)

        async with XdsClient(pilot.grpc_target) as client:
            status_response = await client.client_status([NODE_ID])
        (config,) = status_response.config
        shown = {(c.type_url, c.name) for c in config.generic_xds_configs}
        assert (types.LISTENER, f"127.0.0.1_{reviews_port}") in shown
        assert (types.ROUTE, str(reviews_port)) in shown
