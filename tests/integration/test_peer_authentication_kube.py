"""PeerAuthentication from the (test) Kubernetes API server: watched, applied, survived.

pilot on the test API server serves a sidecar of namespace `shop`; a STRICT
PeerAuthentication there takes the plaintext chains off its `virtualInbound`
without a restart, deleting it brings them back, a mesh-wide one in
`istio-system` reaches namespaces without their own, and one the API server
should never have accepted (a mode that is no mode) is counted as invalid and
changes nothing. An API server without Istio's CRDs gets one warning line and
PERMISSIVE everywhere, and pilot is ready.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from envoy.config.listener.v3 import listener_pb2

from pilot.xds import types
from tests.harness.envoy_process import wait_until
from tests.kubeapi import KubeAPIServer, write_kubeconfig
from tests.protocol.client import DeltaStream, XdsClient, delta_resources, node
from tests.support.mesh import Ep, endpoint_slice, service
from tests.support.pilot import running_kube_pilot

TIMEOUT = 30.0
POD = "sidecar~10.44.0.7~reviews-1.shop~shop.svc.cluster.local"


def peer_authentication(namespace: str, mode: Any, name: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "PeerAuthentication",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"mtls": {"mode": mode}},
    }


class Inbound:
    """The virtualInbound a delta ADS stream holds, kept current."""

    def __init__(self, stream: DeltaStream) -> None:
        self.stream = stream
        self.listener = listener_pb2.Listener()

    async def until(self, condition: Callable[[set[str]], bool]) -> set[str]:
        while not condition(self.transports()):
            response = await self.stream.next_response(TIMEOUT)
            held = delta_resources(response)
            if response.type_url == types.LISTENER and "virtualInbound" in held:
                self.listener = held["virtualInbound"].message
            await self.stream.ack(response)
        return self.transports()

    def transports(self) -> set[str]:
        return {c.filter_chain_match.transport_protocol for c in self.listener.filter_chains}


PERMISSIVE = {"tls", "raw_buffer", ""}
STRICT = {"tls", ""}


async def test_peer_authentication_is_watched_in_the_local_cluster(tmp_path: Path) -> None:
    async with KubeAPIServer() as api:
        api.apply(service("reviews", "shop", [("http", 9080)]))
        api.apply(endpoint_slice("reviews", [Ep("10.44.0.7")], "shop", [("http", 8080)]))
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        async with (
            running_kube_pilot(kubeconfig) as pilot,
            XdsClient(pilot.grpc_target) as client,
        ):
            stream = client.delta_ads(node(POD))
            await stream.subscribe(types.CLUSTER, ["*"])
            await stream.subscribe(types.LISTENER, ["*"])
            inbound = Inbound(stream)
            assert await inbound.until(bool) == PERMISSIVE

            api.apply(peer_authentication("shop", "STRICT"))
            assert await inbound.until(lambda t: t == STRICT) == STRICT

            faults = pilot.discovery.watching.faults
            api.apply(peer_authentication("shop", "NOT-A-MODE", name="broken"))
            invalid = ("Kubernetes", "PeerAuthentication", "invalid")
            await wait_until(lambda: faults.counts[invalid], TIMEOUT, "the invalid one counted")
            assert inbound.transports() == STRICT, "what pilot knew stays"

            api.delete("PeerAuthentication", "shop", "default")
            assert await inbound.until(lambda t: t == PERMISSIVE) == PERMISSIVE

            api.apply(peer_authentication("istio-system", "STRICT"))
            assert await inbound.until(lambda t: t == STRICT) == STRICT, "the mesh's default"


async def test_without_istios_crds_pilot_says_so_and_serves_permissive(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An API server that serves no security.istio.io (404): one warning line, ready, and
    every namespace PERMISSIVE."""

    async def not_served(request: web.Request) -> web.Response:
        return web.json_response({"kind": "Status", "code": 404}, status=404)

    route = web.get("/apis/security.istio.io/{version}", not_served)
    async with KubeAPIServer(extra_routes=[route]) as api:
        api.apply(service("reviews", "shop", [("http", 9080)]))
        api.apply(endpoint_slice("reviews", [Ep("10.44.0.7")], "shop", [("http", 8080)]))
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        with caplog.at_level(logging.WARNING, "pilot.sources.kubernetes"):
            async with (
                running_kube_pilot(kubeconfig) as pilot,
                XdsClient(pilot.grpc_target) as client,
            ):
                stream = client.delta_ads(node(POD))
                await stream.subscribe(types.CLUSTER, ["*"])
                await stream.subscribe(types.LISTENER, ["*"])
                assert await Inbound(stream).until(bool) == PERMISSIVE
                assert pilot.discovery.is_ready()
        warned = [r.getMessage() for r in caplog.records if "Istio's CRDs" in r.getMessage()]
        assert len(warned) == 1, warned
        assert not [r for r in api.requests if "peerauthentications" in r.path]
