"""PeerAuthentication without Istio's CRDs: an API server that does not serve them.

The test API server answers 404 for security.istio.io, which the real one in
tests/cluster cannot (it has the CRDs installed, as deploy/ expects): pilot says so in
one warning line, serves PERMISSIVE everywhere, and is ready. The same for the other
Istio kinds it watches (DestinationRule, VirtualService, the kinds it only counts):
one more line naming them all, and no list or watch of any of them. (PeerAuthentication
through the CRD, watched and applied: tests/cluster/test_peer_authentication_crd.py.)
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from aiohttp import web

from pilot.xds import types
from tests.kubeapi import KubeAPIServer, write_kubeconfig
from tests.support.inbound_listener import PERMISSIVE, Inbound
from tests.support.mesh import Ep, endpoint_slice, service
from tests.support.pilot import running_kube_pilot
from tests.support.xds_client import XdsClient, node

TIMEOUT = 30.0
POD = "sidecar~10.44.0.7~reviews-1.shop~shop.svc.cluster.local"


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
        assert len(warned) == 2, warned
        assert "serves no PeerAuthentication" in warned[0]
        assert "DestinationRule" in warned[1] and "VirtualService" in warned[1]
        assert not [r for r in api.requests if "peerauthentications" in r.path]
        assert not [r for r in api.requests if "destinationrules" in r.path]
