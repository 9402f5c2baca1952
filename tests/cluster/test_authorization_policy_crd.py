"""AuthorizationPolicy through Istio's CRD on the real API server, to a sidecar's inbound.

A sidecar of the test's namespace (an xDS stream whose node is the namespace's running
Pod) holds `virtualInbound` without RBAC filters at first. An AuthorizationPolicy
created through the CRD (security.istio.io/v1, as Istio installs it) selecting its Pod
puts them on, without a restart; one selecting another workload does not; deleted,
they go. What the schema admits and pilot cannot use (a principal with a newline)
denies everything in the namespace instead of being dropped, and is counted.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from envoy.config.listener.v3 import listener_pb2

from pilot.xds import types
from tests.cluster.control_plane import ControlPlane
from tests.cluster.workloads import (
    per_kind,
    reviews_sidecar,
)
from tests.support.envoy_process import wait_until
from tests.support.inbound_listener import Inbound

TIMEOUT = 30.0


def authorization_policy(namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def names(listener: listener_pb2.Listener) -> list[str]:
    for chain in listener.filter_chains:  # every chain with RBAC filters names them
        held = chain.metadata.filter_metadata.get("pilot")
        if held is not None:
            return [v.string_value for v in held.fields["authorization_policies"].list_value.values]
    return []


async def test_authorization_policy_from_the_crd_reaches_the_inbound_listener(
    deployed: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        kube, pod, pilot, stream = await reviews_sidecar(stack, deployed, namespace, tmp_path)
        await stream.subscribe(types.CLUSTER, ["*"])
        await stream.subscribe(types.LISTENER, ["*"])
        inbound = Inbound(stream)
        await inbound.until(bool)
        assert names(inbound.listener) == []

        labels = pod["metadata"]["labels"]
        other = await kube.create(
            authorization_policy(namespace, "other", {"selector": {"matchLabels": {"app": "x"}}})
        )
        mine = await kube.create(
            authorization_policy(namespace, "mine", {"selector": {"matchLabels": labels}})
        )
        held = await inbound.until_listener(lambda lst: bool(names(lst)))
        assert names(held) == [f"ALLOW {namespace}/mine"]

        forged = {"rules": [{"from": [{"source": {"principals": ["a\nb"]}}]}]}
        bad = await kube.create(authorization_policy(namespace, "newline", forged))
        held = await inbound.until_listener(lambda lst: len(names(lst)) == 2)
        assert names(held) == [f"ALLOW {namespace}/mine", f"DENY {namespace}/newline"]
        await wait_until(
            lambda: per_kind(pilot, "pilot_k8s_rejected"), TIMEOUT, "the refused one counted",
            until=lambda seen: seen["AuthorizationPolicy"] >= 1,
        )  # fmt: skip

        for policy in (bad, mine, other):
            await kube.delete(policy)
        held = await inbound.until_listener(lambda lst: not names(lst))
        assert not any("rbac" in f.name for c in held.filter_chains for f in c.filters)
