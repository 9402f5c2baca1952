"""PeerAuthentication through Istio's CRD on the real API server, to a sidecar's inbound.

A sidecar of the test's namespace (an xDS stream whose node is the namespace's running
Pod) holds `virtualInbound`: PERMISSIVE (plaintext and TLS chains) at first. Created
through the CRD (security.istio.io/v1, as Istio installs it), a STRICT
PeerAuthentication takes the plaintext chains off, without a restart; deleted, they
are back; a mesh-wide STRICT one in the root namespace (istio-system) reaches the
namespace too. What the CRD's schema refuses (a mode that is no mode) never reaches
pilot: the API server answers 422, as it does for a selector of more labels than
the schema's 4096. A workload policy of many labels (100, more than pilot once kept)
selects its Pod: STRICT, not ignored. What the schema admits and pilot refuses (a
label key longer than any Pod's label can be) is counted as invalid
(`pilot_k8s_rejected`) and changes nothing: the last good state keeps serving.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from pilot.registry.peer_authentication import (
    MAX_LABEL_CHARS,
    MAX_SELECTOR_LABELS,
    ROOT_NAMESPACE,
)
from pilot.xds import types
from tests.cluster.client import Kube, path_of
from tests.cluster.control_plane import ControlPlane
from tests.cluster.workloads import (
    per_kind,
    reviews_sidecar,
)
from tests.support.envoy_process import wait_until
from tests.support.inbound_listener import PERMISSIVE, STRICT, Inbound

TIMEOUT = 30.0


def peer_authentication(
    namespace: str, mode: str, name: str = "default", **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "PeerAuthentication",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"mtls": {"mode": mode}, **spec},
    }


@asynccontextmanager
async def root_namespace(kube: Kube) -> AsyncIterator[None]:
    """The root namespace exists (created if need be, and then deleted afterwards)."""
    created = (await kube.request("GET", path_of("Namespace", name=ROOT_NAMESPACE)))[0] == 404
    if created:
        await kube.create({"apiVersion": "v1", "kind": "Namespace",
                           "metadata": {"name": ROOT_NAMESPACE}})  # fmt: skip
    try:
        yield
    finally:
        if created:
            await kube.delete({"kind": "Namespace", "metadata": {"name": ROOT_NAMESPACE}})


async def test_peer_authentication_from_the_crd_reaches_the_inbound_listener(
    deployed: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    async with AsyncExitStack() as stack:
        kube, pod, pilot, stream = await reviews_sidecar(stack, deployed, namespace, tmp_path)
        name = pod["metadata"]["name"]
        await stream.subscribe(types.CLUSTER, ["*"])
        await stream.subscribe(types.LISTENER, ["*"])
        inbound = Inbound(stream)
        assert await inbound.until(bool) == PERMISSIVE

        strict = await kube.create(peer_authentication(namespace, "STRICT"))
        assert await inbound.until(lambda t: t == STRICT) == STRICT

        status, answer = await kube.request(
            "POST", path_of("PeerAuthentication", namespace),
            peer_authentication(namespace, "NOT-A-MODE", name="no-mode"),
        )  # fmt: skip
        assert status == 422, (status, answer)
        assert "NOT-A-MODE" in answer["message"]

        overlong = {"x" * (MAX_LABEL_CHARS + 1): "x"}  # the schema bounds values, not keys
        nothing = peer_authentication(
            namespace, "DISABLE", name="nothing", selector={"matchLabels": overlong}
        )
        await kube.create(nothing)
        await wait_until(
            lambda: per_kind(pilot, "pilot_k8s_rejected"), TIMEOUT, "the refused one counted",
            until=lambda seen: seen["PeerAuthentication"] >= 1,
        )  # fmt: skip
        assert inbound.transports() == STRICT, "what pilot knew stays"
        await kube.delete(nothing)

        await kube.delete(strict)
        assert await inbound.until(lambda t: t == PERMISSIVE) == PERMISSIVE

        many = {f"label-{i}": "x" for i in range(100)}
        await kube.merge_patch(path_of("Pod", namespace, name), {"metadata": {"labels": many}})
        selected = peer_authentication(
            namespace, "STRICT", name="many-labels", selector={"matchLabels": many}
        )
        await kube.create(selected)
        assert await inbound.until(lambda t: t == STRICT) == STRICT, "the workload's own"
        too_many = {f"label-{i}": "x" for i in range(MAX_SELECTOR_LABELS + 1)}
        status, answer = await kube.request(
            "POST", path_of("PeerAuthentication", namespace),
            peer_authentication(namespace, "DISABLE", name="too-many",
                                selector={"matchLabels": too_many}),
        )  # fmt: skip
        assert status == 422, (status, answer)
        await kube.delete(selected)
        assert await inbound.until(lambda t: t == PERMISSIVE) == PERMISSIVE

        await stack.enter_async_context(root_namespace(kube))
        mesh = await kube.create(peer_authentication(ROOT_NAMESPACE, "STRICT"))
        try:
            assert await inbound.until(lambda t: t == STRICT) == STRICT, "the mesh's default"
        finally:
            await kube.delete(mesh)
