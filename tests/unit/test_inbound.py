"""A sidecar's own inbound listener and clusters, inside wildcard LDS and CDS.

The real pipeline, cache, index updater and generators (clusters, outbound
listeners, inbound); streams are plain protocol machines driven by hand, as
Envoy would over ADS (SotW and delta): tests/unit/inbound_mesh.py. What a user
notices: the chains their pod's Envoy gets for its ports and mode, that nobody
else's Envoy hears of a change to them, and that a node claiming what it is not
changes nothing another proxy reads.
"""

from __future__ import annotations

from envoy.config.cluster.v3 import cluster_pb2

from pilot.builders.inbound import VIRTUAL_INBOUND
from pilot.generators.inbound_proxies import sidecar_of
from pilot.registry.peer_authentication import (
    MtlsMode,
    PeerAuthentication,
    PeerAuthenticationKey,
)
from pilot.xds import types
from pilot.xds.interception import Interception
from pilot.xds.proxy import ProxyKey
from tests.unit.inbound_mesh import (
    ADS,
    CDS_ONLY,
    DELTA_ADS,
    chains,
    endpoints,
    inbound_clusters,
    listener,
    mesh,
    reviews,
    sidecar,
    svc,
)


def strict(namespace: str) -> PeerAuthentication:
    return PeerAuthentication(PeerAuthenticationKey(namespace, "default"), MtlsMode.STRICT)


def test_a_sidecar_gets_chains_for_its_own_target_ports_and_clusters_to_the_app() -> None:
    with mesh() as m:
        reviews(m)
        m.flush()
        pod, other = m.connect(sidecar("10.1.0.1")), m.connect(sidecar("10.1.0.9"), DELTA_ADS)
        assert chains(pod) == [
            "virtualInbound-blackhole",
            "inbound|5432||-mtls",
            "inbound|5432||-plaintext",
            "inbound|8080||-mtls",
            "inbound|8080||-plaintext",
            "inbound|9090||-mtls",
            "inbound|9090||-plaintext",
            "virtualInbound-mtls",
            "virtualInbound",
        ], "target ports, not service ports; PERMISSIVE by default"
        assert inbound_clusters(pod) == {"inbound|8080||", "inbound|9090||", "inbound|5432||"}
        assert "InboundPassthroughCluster" in pod.held["cds"]
        assert "outbound|9080||reviews.shop.svc.cluster.local" in pod.held["cds"]
        assert "virtualOutbound" in pod.held["lds"], "its outbound listeners as before"
        assert chains(other) == [
            "virtualInbound-blackhole",
            "virtualInbound-mtls",
            "virtualInbound",
        ]
        assert inbound_clusters(other) == set()

        cluster = cluster_pb2.Cluster()
        cluster.ParseFromString(pod.held["cds"]["inbound|9090||"])
        assert cluster.type == cluster_pb2.Cluster.ORIGINAL_DST
        assert cluster.upstream_bind_config.source_address.address == "127.0.0.6"
        assert cluster.typed_extension_protocol_options, "gRPC: HTTP/2 to the app"
        inspector = listener(pod).listener_filters[2]
        assert inspector.name == "envoy.filters.listener.http_inspector"
        skipped = inspector.filter_disabled.destination_port_range
        assert (skipped.start, skipped.end) == (5432, 5433), "not on the TCP port"
        mtls = listener(pod).filter_chains[3]
        assert mtls.filter_chain_match.destination_port.value == 8080
        assert list(mtls.filter_chain_match.application_protocols) == [
            "istio-http/1.0",
            "istio-http/1.1",
            "istio-h2",
        ]


def test_streams_that_read_no_listeners_or_capture_nothing_get_no_inbound() -> None:
    with mesh() as m:
        reviews(m)
        m.flush()
        cds_only = m.connect(sidecar("10.1.0.1"), CDS_ONLY)
        no_capture = m.connect(sidecar("10.1.0.1"), ADS, Interception.NONE)
        gateway = m.connect(ProxyKey("router~10.1.0.1~gw.shop~shop.svc.cluster.local", None))
        assert inbound_clusters(cds_only) == set()
        assert "InboundPassthroughCluster" not in cds_only.held["cds"]
        assert VIRTUAL_INBOUND not in no_capture.held["lds"]
        assert inbound_clusters(no_capture) == set()
        assert VIRTUAL_INBOUND not in gateway.held["lds"]


def test_a_change_to_one_pods_inbound_reaches_that_pod_only() -> None:
    with mesh() as m:
        reviews(m)
        m.updater.upsert_service(svc("ratings", ("http", 80)))
        m.updater.upsert_endpoints(endpoints("ratings", ["10.2.0.1"], ("http", 8000)))
        m.flush()
        pod, bystander = m.connect(sidecar("10.1.0.1")), m.connect(sidecar("10.3.0.1"))
        joining = m.connect(sidecar("10.2.0.2"), DELTA_ADS)

        m.updater.upsert_endpoints(endpoints("ratings", ["10.2.0.1", "10.2.0.3"], ("http", 8000)))
        m.flush()
        assert pod.notified == bystander.notified == [], "an endpoint elsewhere: EDS only"
        assert joining.notified == []

        m.updater.upsert_endpoints(endpoints("ratings", ["10.2.0.1", "10.2.0.2"], ("http", 8000)))
        m.flush()
        assert joining.notified == ["cds", "lds"], "its IP joined: its own CDS, then LDS"
        assert pod.notified == bystander.notified == []
        m.take(joining)
        assert inbound_clusters(joining) == {"inbound|8000||"}
        assert "inbound|8000||-mtls" in chains(joining)

        m.updater.upsert_endpoints(endpoints("ratings", ["10.2.0.1"], ("http", 8000)))
        m.flush()
        m.take(joining)
        assert inbound_clusters(joining) == set(), "delta: removed when its IP left"
        assert "inbound|8000||-mtls" not in chains(joining)


def test_a_service_changing_its_ports_pushes_its_pods_lds_and_cds() -> None:
    with mesh() as m:
        reviews(m)
        m.flush()
        pod, bystander = m.connect(sidecar("10.1.0.1")), m.connect(sidecar("10.3.0.1"))
        theirs = bystander.held["lds"][VIRTUAL_INBOUND]
        m.updater.upsert_service(svc("reviews", ("http", 9080), ("grpc-api", 9090)))
        m.flush()
        assert "lds" in pod.notified and "cds" in pod.notified
        m.take(pod)
        assert inbound_clusters(pod) == {"inbound|8080||", "inbound|9090||"}
        assert "inbound|5432||-mtls" not in chains(pod)
        m.take(bystander)  # its outbound side changed (a full change), its inbound did not
        assert bystander.held["lds"][VIRTUAL_INBOUND] == theirs


def test_strict_and_disable_by_namespace_and_the_mesh_default() -> None:
    with mesh() as m:
        reviews(m)
        m.updater.upsert_service(svc("cart", ("http", 80), namespace="cart"))
        m.updater.upsert_endpoints(
            endpoints("cart", ["10.5.0.1"], ("http", 8080), namespace="cart")
        )
        m.flush()
        shop, cart = m.connect(sidecar("10.1.0.1")), m.connect(sidecar("10.5.0.1", "cart"))

        m.updater.upsert_peer_authentication(strict("shop"))
        m.flush()
        assert shop.notified == ["lds"], "the mode changes the listener only"
        assert cart.notified == []
        m.take(shop)
        assert not any(name.endswith("-plaintext") for name in chains(shop))
        assert "virtualInbound" not in chains(shop), "no plaintext passthrough either"
        assert "inbound|8080||-mtls" in chains(shop)

        disable = PeerAuthentication(
            PeerAuthenticationKey("istio-system", "mesh"), MtlsMode.DISABLE
        )
        m.updater.upsert_peer_authentication(disable)
        m.flush()
        assert cart.notified == ["lds"], "the mesh's default reaches namespaces without one"
        m.take(cart)
        assert not any(name.endswith("-mtls") for name in chains(cart))
        assert shop.notified == ["lds"], "shop's own STRICT still wins"

        m.updater.delete_peer_authentication(strict("shop").key)
        m.flush()
        m.take(shop)
        assert "inbound|8080||-mtls" not in chains(shop), "back to the mesh's: DISABLE"


def test_proxies_of_one_shape_share_one_serialized_listener_and_let_it_go() -> None:
    with mesh() as m:
        reviews(m, ["10.1.0.1", "10.1.0.2"])
        m.flush()
        a, b = m.connect(sidecar("10.1.0.1")), m.connect(sidecar("10.1.0.2"), DELTA_ADS)
        assert m.inbound.shapes == 1
        view_a, view_b = m.pipeline.view(a), m.pipeline.view(b)
        assert view_a.get(types.LISTENER, VIRTUAL_INBOUND) is view_b.get(
            types.LISTENER, VIRTUAL_INBOUND
        ), "the same bytes"
        m.pipeline.leave(a)
        m.pipeline.leave(b)
        assert m.inbound.shapes == 0
        assert m.cache.overlays_of(a.proxy) is None


def test_a_node_claiming_another_pods_ip_or_namespace_changes_nothing_it_reads() -> None:
    with mesh() as m:
        reviews(m)
        m.updater.upsert_peer_authentication(strict("shop"))
        m.flush()
        victim = m.connect(sidecar("10.1.0.1", identity="spiffe://cluster.local/ns/shop/sa/rev"))
        before = m.take(victim)["lds"][VIRTUAL_INBOUND]
        # Same IP, a permissive namespace in its node id, nothing proven.
        m.connect(sidecar("10.1.0.1", "elsewhere"))
        # Same IP, claims `elsewhere` in its node id but proved `shop`: shop's mode.
        proven = m.connect(
            sidecar("10.1.0.1", "elsewhere", "spiffe://cluster.local/ns/shop/sa/rev")
        )
        assert m.pipeline.view(victim).get(types.LISTENER, VIRTUAL_INBOUND).payload == before
        assert victim.notified == []
        assert not any(name.endswith("-plaintext") for name in chains(proven))


def test_shapes_are_bounded_by_the_registry_not_by_what_nodes_claim() -> None:
    with mesh() as m:
        for i in range(50):
            m.updater.upsert_service(svc(f"s{i}", ("http", 80)))
            m.updater.upsert_endpoints(endpoints(f"s{i}", [f"10.9.0.{i}"], ("http", 8000 + i)))
        m.flush()
        strangers = [m.connect(sidecar(f"203.0.113.{i}")) for i in range(200)]
        assert m.inbound.shapes == 1, "IPs the registry does not know: one shape"
        pods = [m.connect(sidecar(f"10.9.0.{i}")) for i in range(50)]
        assert m.inbound.shapes == 51
        for stream in strangers + pods:
            m.pipeline.leave(stream)
        assert m.inbound.shapes == 0
        assert not [k for k in m.cache._tables if k[1].startswith("inbound")], "tables dropped"
        assert not m.inbound._cluster_resources, "and the clusters only they held"


def test_sidecar_node_ids() -> None:
    assert sidecar_of("sidecar~10.1.0.1~a.b~b.svc.cluster.local") == ("10.1.0.1", "b")
    assert sidecar_of("router~10.1.0.1~a.b~b.svc.cluster.local") is None
    assert sidecar_of("sidecar~~a.b~b.svc.cluster.local") is None
    assert sidecar_of("sidecar~10.1.0.1") is None
    assert sidecar_of("sidecar~1~2~3~4") is None
