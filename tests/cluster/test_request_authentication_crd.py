"""RequestAuthentication through Istio's CRD on the real API server, to a sidecar's inbound.

A sidecar of the test's namespace (an xDS stream whose node is the namespace's running
Pod) holds `virtualInbound` without `jwt_authn` at first. A RequestAuthentication
created through the CRD (security.istio.io/v1, as Istio installs it) selecting its Pod
puts the filter on its HTTP chains, with a cluster for its jwksUri, without a restart;
one selecting another workload does not. What the schema admits and pilot refuses (an
issuer with a newline, a jwksUri on Envoy's admin port) is counted and leaves the last
good version in place; deleted, the filter and the cluster go.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from envoy.config.listener.v3 import listener_pb2

from pilot.xds import types
from tests.cluster.client import path_of
from tests.cluster.control_plane import ControlPlane
from tests.cluster.workloads import per_kind, reviews_sidecar
from tests.support.envoy_process import wait_until
from tests.support.jwt_tokens import ISSUER, SigningKey
from tests.support.xds_client import DeltaStream, delta_resources

TIMEOUT = 30.0
JWKS_URI = "https://keys.example.com/realms/test/jwks.json"
JWKS_CLUSTER = "jwks|https|keys.example.com|443"


def request_authentication(namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "RequestAuthentication",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


class Held:
    """The virtualInbound and the cluster names a delta ADS stream holds, kept current."""

    def __init__(self, stream: DeltaStream) -> None:
        self.stream = stream
        self.listener = listener_pb2.Listener()
        self.clusters: set[str] = set()

    async def until(self, condition: Callable[[Held], bool]) -> None:
        while not condition(self):
            response = await self.stream.next_response(TIMEOUT)
            held = delta_resources(response)
            if response.type_url == types.LISTENER and "virtualInbound" in held:
                self.listener = held["virtualInbound"].message
            if response.type_url == types.CLUSTER:
                self.clusters |= held.keys()
                self.clusters -= set(response.removed_resources)
            await self.stream.ack(response)


def verified(listener: listener_pb2.Listener) -> list[str]:
    """The RequestAuthentications an HTTP chain's jwt_authn filter comes from."""
    for chain in listener.filter_chains:
        held = chain.metadata.filter_metadata.get("pilot")
        if held is not None and "request_authentications" in held.fields:
            values = held.fields["request_authentications"].list_value.values
            return [v.string_value for v in values]
    return []


async def test_request_authentication_from_the_crd_reaches_the_inbound_listener(
    deployed: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        kube, pod, pilot, stream = await reviews_sidecar(stack, deployed, namespace, tmp_path)
        await stream.subscribe(types.CLUSTER, ["*"])
        await stream.subscribe(types.LISTENER, ["*"])
        inbound = Held(stream)
        await inbound.until(lambda held: bool(held.listener.filter_chains))
        assert verified(inbound.listener) == []

        labels = pod["metadata"]["labels"]
        other = await kube.create(
            request_authentication(
                namespace,
                "other",
                {
                    "selector": {"matchLabels": {"app": "x"}},
                    "jwtRules": [{"issuer": "other", "jwks": SigningKey().jwks()}],
                },
            )
        )
        rule = {"issuer": ISSUER, "jwksUri": JWKS_URI, "audiences": ["reviews"]}
        spec = {"selector": {"matchLabels": labels}, "jwtRules": [rule]}
        mine = await kube.create(request_authentication(namespace, "mine", spec))
        await inbound.until(lambda held: bool(verified(held.listener)))
        assert verified(inbound.listener) == [f"{namespace}/mine"]
        assert "envoy.filters.http.jwt_authn" in str(inbound.listener)
        await inbound.until(lambda held: JWKS_CLUSTER in held.clusters)

        for hostile in (
            {"issuer": "https://a\nforged line", "jwksUri": JWKS_URI},
            {"issuer": ISSUER, "jwksUri": "http://127.0.0.1:15000/config_dump"},
        ):
            spec["jwtRules"] = [hostile]
            refused = await kube.get(path_of("RequestAuthentication", namespace, "mine"))
            refused["spec"] = spec
            await kube.replace(refused)
        await wait_until(
            lambda: per_kind(pilot, "pilot_k8s_rejected"), TIMEOUT, "the refused ones counted",
            until=lambda seen: seen["RequestAuthentication"] >= 2,
        )  # fmt: skip
        assert verified(inbound.listener) == [f"{namespace}/mine"], "the last good one left"
        assert "15000" not in str(inbound.listener)

        for obj in (mine, other):
            await kube.delete(obj)
        await inbound.until(lambda held: not verified(held.listener))
        assert "jwt_authn" not in str(inbound.listener)
        await inbound.until(lambda held: JWKS_CLUSTER not in held.clusters)
