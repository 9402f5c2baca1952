"""PeerAuthentication without Istio's CRDs: an API server that does not serve them.

The test API server answers 404 for security.istio.io, which the real one in
tests/cluster cannot (it has the CRDs installed, as deploy/ expects): pilot says so in
one warning line, serves PERMISSIVE everywhere, and is ready. (PeerAuthentication
through the CRD, watched and applied: tests/cluster/test_peer_authentication_crd.py.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp import web
from envoy.config.listener.v3 import listener_pb2

from pilot.xds import types
from tests.kubeapi import KubeAPIServer, write_kubeconfig
from tests.support.mesh import Ep, endpoint_slice, service
from tests.support.pilot import running_kube_pilot
from tests.support.xds_client import DeltaStream, XdsClient, delta_resources, node

TIMEOUT = 30.0
POD = "sidecar~10.44.0.7~reviews-1.shop~shop.svc.cluster.local"


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
