"""What a sidecar's stream holds of one service for auto mTLS: its cluster's SANs and
whether its (one) endpoint is marked for mTLS; for the tests of hostile Pods."""

from __future__ import annotations

from envoy.extensions.transport_sockets.tls.v3 import tls_pb2

from pilot.xds import types
from tests.support.xds_client import DeltaStream, delta_resources

TIMEOUT = 30.0


async def sidecar_view(stream: DeltaStream, cluster_name: str) -> tuple[list[str], bool]:
    """Subscribe like a sidecar (clusters, listeners, the service's assignment): the SANs
    of `cluster_name` and whether its endpoint carries `tlsMode: istio`."""
    await stream.subscribe(types.CLUSTER, ["*"])
    await stream.subscribe(types.LISTENER, ["*"])
    await stream.subscribe(types.ENDPOINT, [cluster_name])
    cluster, assignment = None, None
    while cluster is None or assignment is None:
        response = await stream.next_response(TIMEOUT)
        held = delta_resources(response)
        if response.type_url == types.CLUSTER and cluster_name in held:
            cluster = held[cluster_name].message
        if response.type_url == types.ENDPOINT and cluster_name in held:
            assignment = held[cluster_name].message
        await stream.ack(response)
    tls = tls_pb2.UpstreamTlsContext()
    assert cluster.transport_socket_matches[0].transport_socket.typed_config.Unpack(tls)
    validation = tls.common_tls_context.combined_validation_context.default_validation_context
    sans = [m.matcher.exact for m in validation.match_typed_subject_alt_names]
    (lb,) = assignment.endpoints[0].lb_endpoints
    return sans, "envoy.transport_socket_match" in lb.metadata.filter_metadata
