"""AuthorizationPolicy from an API server: watched, applied, replaced, refused, deleted.

The test API server holds Istio's kinds without validating them (no CRD schema), so
it can hand pilot what a real one would refuse: pilot must not drop such an object
(that would let through what it denied) but deny everything in its namespace, count
it as a watch fault and say so in one line. (The real kube-apiserver, with Istio's
CRDs: tests/cluster.)
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from envoy.config.listener.v3 import listener_pb2

from pilot.xds import types
from tests.kubeapi import KubeAPIServer, write_kubeconfig
from tests.support.inbound_listener import Inbound
from tests.support.mesh import Ep, endpoint_slice, service
from tests.support.pilot import running_kube_pilot
from tests.support.xds_client import XdsClient, node

POD_IP = "10.44.0.7"
POD = f"sidecar~{POD_IP}~reviews-1.shop~shop.svc.cluster.local"


def policy(name: str, spec: Any, version: str = "v1") -> dict[str, Any]:
    return {
        "apiVersion": f"security.istio.io/{version}",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": spec,
    }


def names(listener: listener_pb2.Listener) -> list[str]:
    """The policies pilot says the listener's RBAC filters come from."""
    for chain in listener.filter_chains:  # every chain with RBAC filters names them
        held = chain.metadata.filter_metadata.get("pilot")
        if held is not None:
            return [v.string_value for v in held.fields["authorization_policies"].list_value.values]
    return []


async def test_policies_from_the_api_server_and_an_invalid_one_denies(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with KubeAPIServer() as api:
        api.apply(service("reviews", "shop", [("http", 9080)]))
        api.apply(endpoint_slice("reviews", [Ep(POD_IP)], "shop", [("http", 8080)]))
        api.apply(policy("allow-nothing", {}, "v1beta1"))
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        caplog.set_level(logging.WARNING)
        async with running_kube_pilot(kubeconfig) as pilot, XdsClient(pilot.grpc_target) as client:
            stream = client.delta_ads(node(POD))
            await stream.subscribe(types.CLUSTER, ["*"])
            await stream.subscribe(types.LISTENER, ["*"])
            inbound = Inbound(stream)
            held = await inbound.until_listener(lambda lst: bool(names(lst)))
            assert names(held) == ["ALLOW shop/allow-nothing"]

            api.apply(policy("garbage", {"action": "PERMIT", "rules": "everything"}))
            held = await inbound.until_listener(lambda lst: len(names(lst)) == 2)
            assert names(held) == ["ALLOW shop/allow-nothing", "DENY shop/garbage"]
            warned = [r.getMessage() for r in caplog.records if "shop/garbage" in r.getMessage()]
            assert len(warned) == 1 and "fails closed" in warned[0], warned
            faults = pilot.discovery.watching.faults.counts
            assert (
                faults[(pilot.discovery.settings.cluster_id, "AuthorizationPolicy", "invalid")] == 1
            )
            assert pilot.discovery.stats.authz_failed_closed == 1

            api.delete("AuthorizationPolicy", "shop", "garbage")
            api.delete("AuthorizationPolicy", "shop", "allow-nothing")
            held = await inbound.until_listener(lambda lst: not names(lst))
            assert not any("rbac" in f.name for c in held.filter_chains for f in c.filters)
