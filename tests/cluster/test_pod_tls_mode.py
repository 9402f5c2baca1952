"""Auto mTLS from what Kubernetes says of Pods: their `security.istio.io/tlsMode` label
and their ServiceAccount, on the real API server.

Two Deployments, `reviews` (Pods labelled `security.istio.io/tlsMode: istio`, account
`reviews`) and `ratings` (no label, account `ratings`), each behind a Service; their
Pods run by the test kubelet, their endpoints from the real EndpointSlice controller.
Two sidecars' streams (CDS, EDS, LDS, RDS; one on each Service's assignment) see:
- `reviews`' endpoint marked for mTLS (`envoy.transport_socket_match: tlsMode=istio`),
  its cluster's `tlsMode-istio` socket accepting only spiffe://.../sa/reviews;
  `ratings`' endpoint unmarked (plaintext);
- `ratings`' Pod relabelled: other labels and a status write push nothing; the
  label turning its sidecar on is one assignment, to its subscriber only;
- `ratings` rolled out under another ServiceAccount (a new ReplicaSet's Pod, the old
  one terminated): only its cluster is sent again, its SANs the new account's; no
  listener, no route, no other cluster.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

from envoy.config.cluster.v3 import cluster_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2

from pilot.xds import types
from tests.cluster.client import Kube, admin, path_of
from tests.cluster.control_plane import ControlPlane
from tests.cluster.kubelet import set_ready
from tests.cluster.workloads import (
    SERVICE_PORT,
    TLS_MODE,
    Kubelet,
    Obj,
    deployment,
    ensure_account,
    service,
    watching_pilot,
)
from tests.support.deadline import bounded
from tests.support.mesh import cluster_name
from tests.support.pilot import RunningPilot, responses_written
from tests.support.xds_client import DeltaStream, XdsClient, delta_resources, node

TIMEOUT = 30.0
PASSTHROUGH = "PassthroughCluster"
MATCH = "envoy.transport_socket_match"
SIDECARS = {"reviews": "10.244.9.1", "ratings": "10.244.9.2"}  # whose assignment each reads


def spiffe(namespace: str, account: str) -> str:
    return f"spiffe://cluster.local/ns/{namespace}/sa/{account}"


def sans_of(cluster: cluster_pb2.Cluster) -> list[str]:
    """The identities the cluster's mTLS socket accepts."""
    (istio,) = [m for m in cluster.transport_socket_matches if m.name == "tlsMode-istio"]
    context = tls_pb2.UpstreamTlsContext.FromString(istio.transport_socket.typed_config.value)
    validation = context.common_tls_context.combined_validation_context
    matchers = validation.default_validation_context.match_typed_subject_alt_names
    return [m.matcher.exact for m in matchers]


def marked(stream: DeltaStream, cluster: str) -> list[bool]:
    """Per endpoint of `cluster` the stream holds: marked for mTLS."""
    assignment = stream.held[types.ENDPOINT][cluster].message
    return [
        lb.metadata.filter_metadata[MATCH].fields["tlsMode"].string_value == "istio"
        for group in assignment.endpoints
        for lb in group.lb_endpoints
    ]


async def sidecar(client: XdsClient, namespace: str, app: str) -> DeltaStream:
    """A sidecar's stream, subscribed as Envoy with listeners does: every cluster and
    listener, `app`'s assignment, route configuration 80; until each is answered."""
    ip = SIDECARS[app]
    stream = client.delta_ads(
        node(f"sidecar~{ip}~client.{namespace}~{namespace}.svc.cluster.local")
    )
    await stream.subscribe(types.CLUSTER, ["*"])
    await stream.subscribe(types.ENDPOINT, [cluster_name(app, SERVICE_PORT, namespace)])
    await stream.subscribe(types.LISTENER, ["*"])
    await stream.subscribe(types.ROUTE, [str(SERVICE_PORT)])
    wanted = {types.CLUSTER, types.ENDPOINT, types.LISTENER, types.ROUTE}
    while wanted - stream.held.keys() or PASSTHROUGH not in stream.held[types.CLUSTER]:
        await stream.ack(await stream.next_response(TIMEOUT))
    return stream


async def relabel(kube: Kube, pod: Obj, labels: dict[str, str]) -> None:
    meta = pod["metadata"]
    path = path_of("Pod", meta["namespace"], meta["name"])
    await kube.merge_patch(path, {"metadata": {"labels": labels}})


async def start(kube: Kube, namespace: str, kubelet: Kubelet) -> dict[str, Obj]:
    """The two Deployments and Services, one running Pod each (by app)."""
    for app, labels in (("reviews", {TLS_MODE: "istio"}), ("ratings", {})):
        await ensure_account(kube, namespace, app)
        await kube.create(deployment(app, namespace, 1, account=app, labels=labels))
        await kube.create(service(app, namespace))
    return {app: (await kubelet.run_replicas(app, 1))[0] for app in ("reviews", "ratings")}


async def sidecar_label_turns_on(
    kube: Kube, pilot: RunningPilot, streams: dict[str, DeltaStream], pod: Obj, cluster: str
) -> None:
    stats = pilot.discovery.stats
    stats.reset()
    await relabel(kube, pod, {"version": "v2"})
    await set_ready(kube, pod, True)  # a status write, as a kubelet's
    await relabel(kube, pod, {TLS_MODE: "istio"})  # after the churn, on the same watch
    response = await streams["ratings"].next_response(TIMEOUT)
    assert response.type_url == types.ENDPOINT, "a sidecar turning on sends no cluster"
    await streams["ratings"].ack(response)
    assert marked(streams["ratings"], cluster) == [True]
    assert dict(stats.serializations) == {types.ENDPOINT: 1}, "the churn built nothing"
    await responses_written(stats, {types.ENDPOINT: 1})
    assert stats.streams_woken == 1


async def roll_out_under(kube: Kube, kubelet: Kubelet, namespace: str, account: str) -> None:
    """`ratings`' template takes `account`: the new ReplicaSet's Pod runs, the old one
    is terminated (as a kubelet finishes it)."""
    await ensure_account(kube, namespace, account)
    path = path_of("Deployment", namespace, "ratings")
    template = {"spec": {"template": {"spec": {"serviceAccountName": account}}}}
    await kube.merge_patch(path, template)
    await kubelet.run_replicas("ratings", 2)  # the surge: old and new
    await kubelet.finish(await kubelet.terminating("ratings", 1))


async def only_its_cluster_follows(
    streams: dict[str, DeltaStream], cluster: str, account: str
) -> None:
    """Each stream gets CDS responses naming only `cluster` until its SANs are
    [account]; the stream on its assignment gets that too; nothing else comes."""
    for stream in streams.values():
        while sans_of(stream.held[types.CLUSTER][cluster].message) != [account]:
            response = await stream.next_response(TIMEOUT)
            if response.type_url == types.CLUSTER:
                assert set(delta_resources(response)) == {cluster}, "another cluster sent"
            else:
                assert response.type_url == types.ENDPOINT, "a listener or route sent"
            await stream.ack(response)


async def test_pods_labels_and_accounts_drive_auto_mtls(
    deployed: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    reviews, ratings = (
        cluster_name(app, SERVICE_PORT, namespace) for app in ("reviews", "ratings")
    )
    async with AsyncExitStack() as stack:
        kube = await stack.enter_async_context(admin(deployed))
        kubelet = Kubelet(kube, namespace)
        pods = await start(kube, namespace, kubelet)
        pilot = await stack.enter_async_context(
            watching_pilot(kube, deployed, tmp_path, (namespace,))
        )
        client = await stack.enter_async_context(XdsClient(pilot.grpc_target))
        streams = {app: await sidecar(client, namespace, app) for app in SIDECARS}
        assert marked(streams["reviews"], reviews) == [True]
        assert sans_of(streams["reviews"].held[types.CLUSTER][reviews].message) == [
            spiffe(namespace, "reviews")
        ]
        assert marked(streams["ratings"], ratings) == [False], "no sidecar: plaintext"

        await sidecar_label_turns_on(kube, pilot, streams, pods["ratings"], ratings)

        await roll_out_under(kube, kubelet, namespace, "reviews")
        follows = only_its_cluster_follows(streams, ratings, spiffe(namespace, "reviews"))
        await bounded(follows, TIMEOUT)
