"""Auto mTLS with a real Envoy: endpoints whose pod runs a sidecar are reached over mTLS.

The Envoy runs `examples/envoy-sidecar-local.yaml` (listeners, `INTERCEPTION_MODE:
NONE`; certificates by SDS from `sds-grpc`, which is pilot). pilot's registry
file holds three HTTP services, each with one endpoint on its own loopback
address, and Pods at those addresses:

* `reviews`: its pod is labelled `security.istio.io/tlsMode: istio` (service
  account `reviews`); behind it an mTLS server with a certificate pilot's CA
  signed for `reviews`. The request reaches it over mTLS: Istio's SNI and ALPN,
  Envoy's own SPIFFE certificate as the client's;
* `ratings`: its pod carries no label; behind it a plaintext HTTP server, which
  the request reaches in plaintext;
* `details`: its pod is labelled, service account `details`, but the server
  behind it proves `reviews`: Envoy refuses it (a SAN mismatch) and the request
  fails; once the pod's service account is `reviews`, it gets through.

Envoy's /config_dump shows the clusters' transport socket matches and the
endpoints' metadata; a stream that reads no listener gets clusters without them.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from pilot.builders.naming import outbound_cluster_name
from pilot.registry.model import ServiceKey, ServicePort
from pilot.security.identity import Identity
from pilot.xds import types
from tests.integration.envoy_listener_client import free_port, get
from tests.integration.http_backend import BACKEND_BODY, Backend
from tests.integration.mtls_backend import MTLS_BODY, MtlsBackend
from tests.integration.tls_probe import probe_credentials
from tests.support.envoy_process import EnvoyProcess, load_example_bootstrap
from tests.support.envoy_view import assert_nothing_rejected_or_warming
from tests.support.mesh import Ep, endpoint_slice, pod, service
from tests.support.pilot import RunningPilot, running_pilot
from tests.support.xds_client import XdsClient, delta_resources, node

EXAMPLE = "envoy-sidecar-local.yaml"
NODE_ID = "sidecar~127.0.0.1~client.default~default.svc.cluster.local"
CLIENT_ID = "spiffe://cluster.local/ns/default/sa/default"  # the example's node metadata
REVIEWS_IP, RATINGS_IP, DETAILS_IP = "127.0.0.3", "127.0.0.1", "127.0.0.4"
DEADLINE = 30.0


def http_service(name: str, port: int, ip: str, target: int) -> list[dict[str, Any]]:
    return [
        service(name, ports=[("http", port)]),
        endpoint_slice(name, [Ep(ip)], ports=[("http", target)]),
    ]


def cluster_of(name: str, port: int) -> str:
    return outbound_cluster_name(
        ServiceKey("default", name), ServicePort("http", port), "cluster.local"
    )


class Mesh:
    """The registry file's objects: three services, their endpoints and their pods."""

    def __init__(self, ports: dict[str, int], targets: dict[str, int]) -> None:
        self.ports, self.targets = ports, targets
        self.details_account = "details"

    def objects(self) -> list[dict[str, Any]]:
        ips = {"reviews": REVIEWS_IP, "ratings": RATINGS_IP, "details": DETAILS_IP}
        objects = [
            obj
            for name, ip in ips.items()
            for obj in http_service(name, self.ports[name], ip, self.targets[name])
        ]
        return [
            *objects,
            pod("reviews-1", REVIEWS_IP, service_account="reviews", sidecar=True),
            pod("ratings-1", RATINGS_IP, service_account="ratings"),
            pod("details-1", DETAILS_IP, service_account=self.details_account, sidecar=True),
        ]


def tls_context_of(cluster: dict[str, Any]) -> dict[str, Any]:
    matches = {m["name"]: m for m in cluster.get("transport_socket_matches", [])}
    assert matches.keys() == {"tlsMode-istio", "tlsMode-disabled"}, matches.keys()
    assert matches["tlsMode-istio"]["match"] == {"tlsMode": "istio"}
    assert matches["tlsMode-disabled"]["transport_socket"]["name"].endswith("raw_buffer")
    context: dict[str, Any] = matches["tlsMode-istio"]["transport_socket"]["typed_config"]
    return context


def sans_of(context: dict[str, Any]) -> list[str]:
    validation = context["common_tls_context"]["combined_validation_context"]
    matchers = validation["default_validation_context"]["match_typed_subject_alt_names"]
    return [m["matcher"]["exact"] for m in matchers]


async def assert_config_dump_shows_auto_mtls(envoy: EnvoyProcess, mesh: Mesh) -> None:
    reviews = cluster_of("reviews", mesh.ports["reviews"])
    clusters = await envoy.dynamic_active_clusters()
    context = tls_context_of(clusters[reviews]["cluster"])
    assert (
        context["sni"] == f"outbound_.{mesh.ports['reviews']}_._.reviews.default.svc.cluster.local"
    )
    assert context["common_tls_context"]["alpn_protocols"] == ["istio-http/1.1", "istio"]
    assert sans_of(context) == ["spiffe://cluster.local/ns/default/sa/reviews"]
    endpoints = await envoy.dynamic_endpoint_configs()
    (lb,) = endpoints[reviews]["endpoints"][0]["lb_endpoints"]
    assert lb["metadata"]["filter_metadata"]["envoy.transport_socket_match"] == {"tlsMode": "istio"}
    ratings = cluster_of("ratings", mesh.ports["ratings"])
    (plain,) = endpoints[ratings]["endpoints"][0]["lb_endpoints"]
    assert "envoy.transport_socket_match" not in plain["metadata"]["filter_metadata"]


async def gateway_clusters(pilot: RunningPilot) -> dict[str, Any]:
    """The clusters a stream that reads no listener gets."""
    async with XdsClient(pilot.grpc_target) as client:
        stream = client.delta_ads(node("router~127.0.0.9~gw.default~default.svc.cluster.local"))
        await stream.subscribe(types.CLUSTER, ["*"])
        response = await stream.next_response(DEADLINE)
        return {name: r.message for name, r in delta_resources(response).items()}


async def test_sidecar_endpoints_get_mtls_with_their_identity_and_others_plaintext(
    tmp_path: Path,
) -> None:
    async with AsyncExitStack() as stack:
        plain = await stack.enter_async_context(Backend(RATINGS_IP))
        ports = {name: free_port() for name in ("reviews", "ratings", "details")}
        # The backends need certificates from pilot's CA: start pilot on the plaintext
        # service first, then add the others once their servers listen.
        mesh = Mesh(ports, {"reviews": 1, "ratings": plain.port, "details": 1})
        pilot = await stack.enter_async_context(running_pilot(tmp_path, mesh.objects()))
        assert pilot.discovery.security is not None
        ca = pilot.discovery.security.ca
        reviews_identity = probe_credentials(ca, Identity("cluster.local", "default", "reviews"))
        certs = tmp_path / "certs"
        reviews = await stack.enter_async_context(
            MtlsBackend(REVIEWS_IP, reviews_identity, ca.root_pem, certs)
        )
        impostor = await stack.enter_async_context(
            MtlsBackend(DETAILS_IP, reviews_identity, ca.root_pem, certs)
        )
        mesh.targets |= {"reviews": reviews.port, "details": impostor.port}
        pilot.write(mesh.objects())
        (tmp_path / "envoy").mkdir()
        bootstrap = load_example_bootstrap(EXAMPLE, pilot.grpc_port, NODE_ID)
        envoy = await stack.enter_async_context(
            EnvoyProcess(bootstrap, tmp_path / "envoy", "auto-mtls", log_level="warning")
        )

        status, body = await envoy.wait_for(
            lambda: get(ports["reviews"], "reviews"),
            DEADLINE,
            "reviews over mTLS",
            until=lambda answer: answer[0] == 200 and answer[1] == MTLS_BODY,
        )
        handshake = reviews.handshakes[-1]
        assert handshake.sni == f"outbound_.{ports['reviews']}_._.reviews.default.svc.cluster.local"
        assert handshake.alpn == "istio-http/1.1"
        assert handshake.peer_uris == (CLIENT_ID,), "Envoy proved its own SPIFFE identity"

        status, body = await get(ports["ratings"], "ratings")
        assert (status, body.startswith(BACKEND_BODY)) == (200, True), "no sidecar: plaintext"
        assert plain.seen

        status, _ = await get(ports["details"], "details")
        assert status == 503, "a server that proves another identity is refused"
        assert not impostor.handshakes, "no request reached the impostor"
        refused = f"cluster.{cluster_of('details', ports['details'])}.ssl.fail_verify_san"
        await envoy.wait_for_stat(refused, lambda count: isinstance(count, int) and count >= 1)

        await assert_config_dump_shows_auto_mtls(envoy, mesh)
        await assert_nothing_rejected_or_warming(envoy)

        mesh.details_account = "reviews"  # the pod now runs as the identity it proves
        pilot.write(mesh.objects())
        await envoy.wait_for(
            lambda: get(ports["details"], "details"),
            DEADLINE,
            "details once its pod's account is the one its server proves",
            until=lambda answer: answer[0] == 200 and answer[1] == MTLS_BODY,
        )
        assert impostor.handshakes[-1].peer_uris == (CLIENT_ID,)

        gateway = await gateway_clusters(pilot)
        assert not gateway[cluster_of("reviews", ports["reviews"])].transport_socket_matches
