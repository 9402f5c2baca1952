"""Pods for auto mTLS: what a Pod parses to, what the index makes of it, what the builder sends.

Honest pods beside hostile ones (names that are not names, too many IPs, bad
IPs, huge labels, a remote cluster's pod claiming a local pod's IP, two pods
on one IP, churn that changes nothing served).
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.extensions.transport_sockets.tls.v3 import tls_pb2

from pilot.builders.mtls import alpn as alpn_of
from pilot.builders.naming import outbound_cluster_name
from pilot.builders.settings import BuildSettings
from pilot.registry.index import EndpointIndex
from pilot.registry.kubernetes_objects import (
    MAX_POD_IPS,
    MAX_POD_PORTS,
    ObjectError,
    parse_endpoint_slice,
    parse_endpoints,
    parse_pod,
    parse_service,
)
from pilot.registry.model import EndpointPort, EndpointSet, Pod, PodKey, ServiceKey
from pilot.sources.file_format import RegistryFileError, parse_registry
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from pilot.xds.flavor import ADS_WITH_LISTENERS, Flavor
from tests.support.endpoint_index import marked
from tests.support.mesh import Ep, as_list, endpoint_slice, pod, service
from tests.unit.clusters_and_endpoints import ClustersAndEndpoints

WEB = ServiceKey("default", "web")
WEB_CLUSTER = outbound_cluster_name(WEB, parse_service(service("web")).ports[0], "cluster.local")
EAST, WEST = "east", "west"


def _pod(name: str = "web-1", ip: str | None = "10.0.0.1", **kwargs: Any) -> Pod:
    return parse_pod(pod(name, ip, **kwargs), EAST)


def _slice(*ips: str, cluster: str = EAST, name: str = "web-1") -> EndpointSet:
    parsed = parse_endpoint_slice(endpoint_slice("web", [Ep(ip) for ip in ips], name=name), cluster)
    assert parsed is not None
    return parsed


# -- parsing -----------------------------------------------------------------------------


def test_a_pod_keeps_its_ips_account_sidecar_phase_and_ports() -> None:
    parsed = _pod(service_account="reviews", sidecar=True)
    assert parsed == Pod(
        PodKey(EAST, "default", "web-1"),
        ("10.0.0.1",),
        "reviews",
        True,
        "Running",
        (EndpointPort("http", 8080),),
        parsed.labels,
    )
    assert dict(parsed.labels or ()).get("security.istio.io/tlsMode") == "istio"
    assert parsed.serves_endpoints


def test_a_pod_without_a_service_account_runs_as_default_and_ipv6_is_normalised() -> None:
    raw = pod("web-1", "10.0.0.1")
    del raw["spec"]["serviceAccountName"]
    raw["status"]["podIPs"] = [{"ip": "10.0.0.1"}, {"ip": "fd00:0:0::1"}]
    parsed = parse_pod(raw)
    assert parsed.service_account == "default" and parsed.ips == ("10.0.0.1", "fd00::1")
    assert not parsed.istio_mtls


def test_other_tls_modes_and_labels_are_not_a_sidecar() -> None:
    assert not _pod(labels={"security.istio.io/tlsMode": "disabled"}).istio_mtls
    assert not _pod(labels={"sidecar.istio.io/inject": "true"}).istio_mtls


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_done_pods_and_pods_without_an_ip_serve_no_endpoint(phase: str) -> None:
    assert not _pod(phase=phase).serves_endpoints
    assert not _pod(ip=None, phase="Pending").serves_endpoints


def test_a_host_network_pod_keeps_no_address_it_shares_with_its_node() -> None:
    raw = pod("agent-1", "10.0.0.9")
    raw["spec"]["hostNetwork"] = True
    assert not parse_pod(raw).serves_endpoints


def _broken(change: Any) -> dict[str, Any]:
    raw = pod("web-1", "10.0.0.1")
    change(raw)
    return raw


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda p: p["metadata"].update(namespace="NS\n<b>"), "metadata.namespace"),
        (lambda p: p["metadata"].update(name="x" * 300), "metadata.name"),
        (lambda p: p["spec"].update(serviceAccountName="sa/../../x"), "serviceAccountName"),
        (lambda p: p["spec"].update(serviceAccountName=["a"]), "serviceAccountName"),
        (lambda p: p["status"].update(podIPs=[{"ip": "10.0.0.1; rm"}]), "not an IP address"),
        (lambda p: p["status"].update(podIPs=[{"ip": "x" * 100_000}]), "status.podIPs"),
        (
            lambda p: p["status"].update(podIPs=[{"ip": f"10.0.0.{i}"} for i in range(1, 200)]),
            f"at most {MAX_POD_IPS}",
        ),
        (lambda p: p["status"].update(podIPs="10.0.0.1"), "must be a list"),
        (
            lambda p: p["spec"]["containers"][0].update(
                ports=[{"containerPort": 1 + i} for i in range(MAX_POD_PORTS + 1)]
            ),
            f"more than {MAX_POD_PORTS}",
        ),
        (
            lambda p: p["spec"]["containers"][0].update(ports=[{"containerPort": 70000}]),
            "port number",
        ),
        (lambda p: p["metadata"].update(labels=["a"]), "metadata.labels"),
    ],
)
def test_a_hostile_pod_is_an_error_naming_it_and_the_field(change: Any, said: str) -> None:
    with pytest.raises(ObjectError) as error:
        parse_pod(_broken(change))
    message = str(error.value)
    assert said in message and message.startswith("Pod ")
    assert message.isprintable() and len(message) < 700, "one bounded line, whatever the name"


def test_huge_labels_cost_nothing_kept() -> None:
    raw = pod("web-1", "10.0.0.1", labels={f"k{i}": "v" * 60 for i in range(5000)})
    parsed = parse_pod(raw)
    assert parsed.ips == ("10.0.0.1",) and not parsed.istio_mtls
    assert parsed.labels is None, "none kept: no selector can be told to match it"


def test_many_pods_share_their_namespace_and_account_strings() -> None:
    first = parse_pod(pod("web-1", "10.0.0.1", service_account="reviews"))
    second = parse_pod(pod("web-2", "10.0.0.2", service_account="".join(["rev", "iews"])))
    assert first.service_account is second.service_account


# -- the index ---------------------------------------------------------------------------


def _marked(index: EndpointIndex, ip: str, service: ServiceKey = WEB) -> bool:
    """Whether the index marks `service`'s endpoint at `ip` for mTLS (its pod's sidecar)."""
    return marked(index, ip, service)


def _index() -> EndpointIndex:
    index = EndpointIndex(primary=EAST)
    index.upsert_service(parse_service(service("web"), EAST))
    index.upsert_endpoints(_slice("10.0.0.1", "10.0.0.2"))
    return index


def test_a_pod_with_a_sidecar_is_a_full_change_once_its_account_is_new() -> None:
    index = _index()
    change = index.upsert_pod(_pod(service_account="web", sidecar=True))
    assert change.full == {WEB}, "the cluster's SANs name the new account"
    assert _marked(index, "10.0.0.1") and not _marked(index, "10.0.0.2")
    assert index.service_accounts(WEB) == {("default", "web")}


def test_a_second_pod_of_a_known_account_is_an_endpoint_change_only() -> None:
    index = _index()
    index.upsert_pod(_pod(service_account="web", sidecar=True))
    change = index.upsert_pod(_pod("web-2", "10.0.0.2", service_account="web", sidecar=True))
    assert change.endpoints == {WEB} and not change.full


def test_turning_a_sidecar_off_is_an_endpoint_change() -> None:
    index = _index()
    index.upsert_pod(_pod(service_account="web", sidecar=True))
    change = index.upsert_pod(_pod(service_account="web"))
    assert change.endpoints == {WEB} and not change.full
    assert not _marked(index, "10.0.0.1")


def test_status_and_label_churn_changes_nothing_served() -> None:
    index = _index()
    index.upsert_pod(_pod(service_account="web", sidecar=True))
    relabelled = index.upsert_pod(_pod(service_account="web", sidecar=True, labels={"v": "2"}))
    assert not relabelled.full and not relabelled.endpoints
    assert relabelled.workloads == {"10.0.0.1"}, "only its sidecar's policies may move"
    assert not index.upsert_pod(_pod(service_account="web", sidecar=True, labels={"v": "2"}))
    pending = _pod(service_account="web", sidecar=True, labels={"v": "2"}, phase="Pending")
    assert not index.upsert_pod(pending)


def test_a_pod_that_finishes_is_forgotten() -> None:
    index = _index()
    index.upsert_pod(_pod(service_account="web", sidecar=True))
    change = index.upsert_pod(_pod(service_account="web", sidecar=True, phase="Succeeded"))
    assert change.full == {WEB} and index.pod_count == 0
    assert index.service_accounts(WEB) == frozenset()


def test_an_endpoint_change_keeping_the_accounts_stays_eds_only() -> None:
    index = _index()
    index.upsert_pod(_pod(service_account="web", sidecar=True))
    index.upsert_pod(_pod("web-2", "10.0.0.2", service_account="web", sidecar=True))
    change = index.upsert_endpoints(_slice("10.0.0.1"))
    assert change.endpoints == {WEB} and not change.full
    assert index.replace_cluster(
        EAST, [parse_service(service("web"), EAST)], [_slice("10.0.0.1", name="renamed")]
    ) == type(change)(endpoints=frozenset({WEB})), "a renamed slice is no full change"


def test_an_endpoint_change_that_changes_the_accounts_is_full() -> None:
    index = _index()
    index.upsert_pod(_pod(service_account="web", sidecar=True))
    index.upsert_pod(_pod("web-2", "10.0.0.2", service_account="other", sidecar=True))
    assert index.upsert_endpoints(_slice("10.0.0.1")).full == {WEB}


def test_a_remote_pod_claiming_a_local_ip_changes_no_local_endpoint() -> None:
    index = _index()
    index.upsert_pod(_pod(service_account="web", sidecar=True))
    intruder = parse_pod(pod("evil", "10.0.0.1", service_account="evil"), WEST)
    change = index.upsert_pod(intruder)
    assert not change.full and not change.endpoints
    assert index.service_accounts(WEB) == {("default", "web")}
    assert index.pod_for(_slice().key, "10.0.0.1", None) == _pod(
        service_account="web", sidecar=True
    )


def test_two_pods_on_one_ip_use_the_first_by_name_whichever_came_first() -> None:
    late = _index()
    late.upsert_pod(_pod("web-b", service_account="b"))
    late.upsert_pod(_pod("web-a", service_account="a", sidecar=True))
    early = _index()
    early.upsert_pod(_pod("web-a", service_account="a", sidecar=True))
    early.upsert_pod(_pod("web-b", service_account="b"))
    for index in (late, early):
        assert index.service_accounts(WEB) == {("default", "a")}
        assert _marked(index, "10.0.0.1")
    late.delete_pod(PodKey(EAST, "default", "web-a"))
    assert late.service_accounts(WEB) == {("default", "b")}


def test_replace_pods_of_one_cluster_leaves_the_others() -> None:
    index = _index()
    index.upsert_endpoints(_slice("10.0.0.1", cluster=WEST, name="web-west"))
    west = parse_pod(pod("web-w", "10.0.0.1", service_account="west"), WEST)
    index.upsert_pod(west)
    index.upsert_pod(_pod(service_account="east"))
    assert index.replace_pods(WEST, []).full == {WEB}
    assert index.service_accounts(WEB) == {("default", "east")}


def test_pod_churn_returns_the_memory_of_the_pods_it_removes() -> None:
    index = _index()
    for round_ in range(3):
        for i in range(500):
            index.upsert_pod(_pod(f"churn-{round_}-{i}", f"10.1.{i // 250}.{i % 250}"))
        for i in range(500):
            index.delete_pod(PodKey(EAST, "default", f"churn-{round_}-{i}"))
    assert index.pod_count == 0 and not index._pods_at


# -- the builder -------------------------------------------------------------------------


def _built(*pods: Pod) -> ResourceCache:
    index, cache = EndpointIndex(primary=EAST), ResourceCache()
    builder = ClustersAndEndpoints(
        index, cache, BuildSettings(trust_domain="example.org"), XdsStats()
    )
    builder.apply(index.replace_cluster(EAST, [parse_service(service("web"), EAST)], [_slice()]))
    builder.apply(index.upsert_endpoints(_slice("10.0.0.1", "10.0.0.2")))
    for each in pods:
        builder.apply(index.upsert_pod(each))
    return cache


def _cluster(cache: ResourceCache, flavor: str) -> cluster_pb2.Cluster:
    resource = cache.get(types.CLUSTER, WEB_CLUSTER, flavor=flavor)
    assert resource is not None
    return cluster_pb2.Cluster.FromString(resource.payload)


def test_only_sidecars_clusters_carry_auto_mtls_and_others_are_unchanged() -> None:
    without, with_pods = _built(), _built(_pod(service_account="web", sidecar=True))
    for flavor in Flavor:
        before = without.get(types.CLUSTER, WEB_CLUSTER, flavor=flavor.value)
        after = with_pods.get(types.CLUSTER, WEB_CLUSTER, flavor=flavor.value)
        assert before is not None and after is not None and before.payload == after.payload
        assert not _cluster(with_pods, flavor.value).transport_socket_matches
    sidecar = _cluster(with_pods, ADS_WITH_LISTENERS)
    istio, disabled = sidecar.transport_socket_matches
    assert (istio.name, dict(istio.match.fields)["tlsMode"].string_value) == (
        "tlsMode-istio",
        "istio",
    )
    assert disabled.name == "tlsMode-disabled" and not disabled.match.fields
    assert disabled.transport_socket.name == "envoy.transport_sockets.raw_buffer"
    tls = tls_pb2.UpstreamTlsContext()
    assert istio.transport_socket.typed_config.Unpack(tls)
    assert tls.sni == "outbound_.80_._.web.default.svc.cluster.local"
    common = tls.common_tls_context
    assert list(common.alpn_protocols) == ["istio-http/1.1", "istio"]
    (workload,) = common.tls_certificate_sds_secret_configs
    root = common.combined_validation_context.validation_context_sds_secret_config
    for secret, name in ((workload, "default"), (root, "ROOTCA")):
        assert secret.name == name
        (grpc,) = secret.sds_config.api_config_source.grpc_services
        assert grpc.envoy_grpc.cluster_name == "sds-grpc"
    sans = common.combined_validation_context.default_validation_context
    assert [m.matcher.exact for m in sans.match_typed_subject_alt_names] == [
        "spiffe://example.org/ns/default/sa/web"
    ]


@pytest.mark.parametrize(
    ("port", "alpn"),
    [
        (("http", 80), ["istio-http/1.1", "istio"]),
        (("grpc", 80), ["istio-h2", "istio"]),
        (("http2-web", 80), ["istio-h2", "istio"]),
        (("tcp-db", 80), ["istio-peer-exchange", "istio"]),
        (("", 80), ["istio-peer-exchange", "istio"]),
    ],
)
def test_alpn_follows_the_destination_ports_protocol(
    port: tuple[str, int], alpn: list[str]
) -> None:
    assert list(alpn_of(parse_service(service("web", ports=[port])).ports[0])) == alpn


def test_a_service_with_no_known_pod_accepts_no_identity() -> None:
    cluster = _cluster(_built(), ADS_WITH_LISTENERS)
    tls = tls_pb2.UpstreamTlsContext()
    cluster.transport_socket_matches[0].transport_socket.typed_config.Unpack(tls)
    sans = tls.common_tls_context.combined_validation_context.default_validation_context
    (only,) = sans.match_typed_subject_alt_names
    assert "/ns/" not in only.matcher.exact, "no real identity is accepted"


def test_endpoints_of_sidecars_carry_the_transport_socket_match() -> None:
    cache = _built(_pod(service_account="web", sidecar=True))
    resource = cache.get(types.ENDPOINT, WEB_CLUSTER)
    assert resource is not None
    assignment = endpoint_pb2.ClusterLoadAssignment.FromString(resource.payload)
    marked = {
        lb.endpoint.address.socket_address.address: dict(
            lb.metadata.filter_metadata["envoy.transport_socket_match"].fields
        )
        for group in assignment.endpoints
        for lb in group.lb_endpoints
    }
    assert marked["10.0.0.1"]["tlsMode"].string_value == "istio"
    assert marked["10.0.0.2"] == {}


# -- the registry file -------------------------------------------------------------------


def test_the_registry_file_accepts_pods_in_their_cluster() -> None:
    text = as_list([service("web"), pod("web-1", "10.0.0.1", sidecar=True)])
    state = parse_registry(text, "mesh.yaml", EAST)
    (parsed,) = state.pods
    assert parsed.key == PodKey(EAST, "default", "web-1") and parsed.istio_mtls


def test_the_registry_file_names_a_bad_or_repeated_pod() -> None:
    bad = as_list([pod("web-1", "not-an-ip")])
    with pytest.raises(RegistryFileError, match=r"mesh.yaml: document 1 item 0: Pod default/web-1"):
        parse_registry(bad, "mesh.yaml")
    twice = as_list([pod("web-1", "10.0.0.1"), pod("web-1", "10.0.0.2")])
    with pytest.raises(RegistryFileError, match="already in the file"):
        parse_registry(twice, "mesh.yaml")


def test_a_slice_hiding_legacy_endpoints_recounts_their_accounts() -> None:
    index = EndpointIndex(primary=EAST)
    index.upsert_service(parse_service(service("web"), EAST))
    legacy = parse_endpoints(
        {
            "kind": "Endpoints",
            "metadata": {"name": "web"},
            "subsets": [{"addresses": [{"ip": "10.0.0.5"}], "ports": [{"port": 8080}]}],
        },
        EAST,
    )
    index.upsert_endpoints(legacy)
    index.upsert_pod(_pod("legacy-1", "10.0.0.5", service_account="legacy"))
    assert index.service_accounts(WEB) == {("default", "legacy")}
    change = index.upsert_endpoints(_slice("10.0.0.6"))  # no pod there, yet it hides 10.0.0.5
    assert change.full == {WEB} and index.service_accounts(WEB) == frozenset()


def test_empty_endpoint_sets_come_and_go_beside_others() -> None:
    index = _index()
    empty = _slice(name="web-empty")
    index.upsert_endpoints(empty)
    index.delete_endpoints(_slice().key)  # the cluster's last address goes
    assert not index.delete_endpoints(empty.key).full
    assert not index._sets_at, "nothing left behind"


def _brute_accounts(index: EndpointIndex, service: ServiceKey) -> frozenset[tuple[str, str]]:
    """A service's accounts recomputed from scratch: what the index keeps must equal it."""
    pods = list(index._pods.values())
    found = set()
    for endpoint_set in index.endpoint_sets(service):
        key = endpoint_set.key
        for group in endpoint_set.groups:
            for endpoint in group.endpoints:
                for ip in endpoint.addresses:
                    claimants = sorted(
                        p.key
                        for p in pods
                        if (p.key.cluster, p.key.namespace) == (key.cluster, key.namespace)
                        and ip in p.ips
                    )
                    if claimants:
                        chosen = index._pods[claimants[0]]
                        found.add((chosen.key.namespace, chosen.service_account))
    return frozenset(found)


def _marks(index: EndpointIndex, service: ServiceKey) -> dict[tuple[str, str], bool]:
    """Which of a service's endpoints its assignment marks for mTLS."""
    return {
        (endpoint_set.key.cluster, ip): index.runs_sidecar(endpoint_set.key, endpoint, ip)
        for endpoint_set in index.endpoint_sets(service)
        for group in endpoint_set.groups
        for endpoint in group.endpoints
        for ip in endpoint.addresses
    }


def test_random_pod_and_endpoint_changes_keep_accounts_and_pushes_right() -> None:
    """Slices, legacy Endpoints (hidden by slices) and pods in two clusters, at random:
    the counted identities always equal a recount from scratch."""
    rng = random.Random(18)
    services = [ServiceKey("default", name) for name in ("web", "api")]
    index = EndpointIndex(primary=EAST)
    for key in services:
        index.upsert_service(parse_service(service(key.name), EAST))
    ips = [f"10.0.0.{i}" for i in range(1, 6)]
    for _ in range(4000):
        before = {key: index.service_accounts(key) for key in services}
        marks = {key: _marks(index, key) for key in services}
        op = rng.randrange(5)
        cluster = rng.choice([EAST, WEST])
        if op == 4:  # legacy Endpoints, fed in only where the cluster has no slice
            svc = rng.choice(services)
            addresses = [{"ip": ip} for ip in rng.sample(ips, rng.randrange(3))]
            raw_legacy = {
                "kind": "Endpoints",
                "metadata": {"name": svc.name},
                "subsets": [{"addresses": addresses, "ports": [{"name": "http", "port": 80}]}],
            }
            legacy = parse_endpoints(raw_legacy, cluster)
            change = (
                index.upsert_endpoints(legacy)
                if rng.random() < 0.7
                else index.delete_endpoints(legacy.key)
            )
        elif op == 0:
            svc = rng.choice(services)
            raw = endpoint_slice(
                svc.name,
                [Ep(ip) for ip in rng.sample(ips, rng.randrange(3))],
                name=f"{svc.name}-{rng.randrange(2)}",
            )
            parsed = parse_endpoint_slice(raw, cluster)
            assert parsed is not None
            change = index.upsert_endpoints(parsed)
        elif op == 1:
            name = f"{rng.choice(services).name}-{rng.randrange(2)}"
            change = index.delete_endpoints(_slice(cluster=cluster, name=name).key)
        elif op == 2:
            raw = pod(
                f"p-{rng.randrange(4)}",
                rng.choice(ips),
                service_account=rng.choice(["a", "b"]),
                sidecar=rng.random() < 0.5,
                phase=rng.choice(["Running", "Running", "Succeeded"]),
            )
            change = index.upsert_pod(parse_pod(raw, cluster))
        else:
            change = index.delete_pod(PodKey(cluster, "default", f"p-{rng.randrange(4)}"))
        for key in services:
            assert index.service_accounts(key) == _brute_accounts(index, key)
            if index.service_accounts(key) != before[key]:
                assert key in change.full, "a new set of accounts is a full change"
            if _marks(index, key) != marks[key]:
                assert key in change.endpoints, "a changed assignment is pushed"
            elif op in (2, 3) and index.service_accounts(key) == before[key]:
                assert key not in change.full | change.endpoints, "a pod change that is none"


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p["status"].update(phase=["Running"]),
        lambda p: p["spec"]["containers"][0]["ports"][0].update(protocol={"a": 1}),
        lambda p: p["spec"].update(containers={"app": {}}),
        lambda p: p["status"].update(podIPs=[["10.0.0.1"]]),
        lambda p: p["spec"].update(serviceAccountName=7),
    ],
)
def test_wrong_types_in_a_registry_file_pod_are_one_clear_error_or_harmless(change: Any) -> None:
    text = as_list([_broken(change)])
    try:
        state = parse_registry(text, "mesh.yaml")
    except RegistryFileError as error:
        assert str(error).startswith("mesh.yaml: document 1 item 0: Pod default/web-1")
    else:
        (parsed,) = state.pods
        assert parsed.phase == "Unknown", "a phase that is no phase is Unknown"
