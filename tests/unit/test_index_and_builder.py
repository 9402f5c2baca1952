"""The endpoint index says what kind of push a change needs; the builder rebuilds only that."""

from __future__ import annotations

from pilot.builders.settings import BuildSettings
from pilot.registry.index import EndpointIndex
from pilot.registry.kubernetes_objects import parse_endpoint_slice, parse_endpoints, parse_service
from pilot.registry.model import EndpointSet, Service, ServiceKey
from pilot.stats import XdsStats
from pilot.xds import types
from pilot.xds.cache import ResourceCache
from tests.support.mesh import Ep, cluster_name, endpoint_slice, service
from tests.unit.clusters_and_endpoints import ClustersAndEndpoints

WEB = ServiceKey("default", "web")


def _svc(ports: tuple[tuple[str, int], ...] = (("http", 80),)) -> Service:
    return parse_service(service("web", ports=ports))


def _slice(*ips: str, name: str = "web-1") -> EndpointSet:
    parsed = parse_endpoint_slice(endpoint_slice("web", [Ep(ip) for ip in ips], name=name))
    assert parsed is not None
    return parsed


def test_new_service_is_full_then_endpoints_are_incremental() -> None:
    index = EndpointIndex()
    assert index.upsert_service(_svc()).full == {WEB}
    change = index.upsert_endpoints(_slice("10.0.0.1"))
    assert change.endpoints == {WEB} and not change.full


def test_same_content_is_no_change() -> None:
    index = EndpointIndex()
    index.upsert_service(_svc())
    index.upsert_endpoints(_slice("10.0.0.1"))
    assert not index.upsert_service(_svc())
    assert not index.upsert_endpoints(_slice("10.0.0.1"))


def test_dropping_to_zero_endpoints_is_not_a_full_push() -> None:
    index = EndpointIndex()
    index.upsert_service(_svc())
    index.upsert_endpoints(_slice("10.0.0.1"))
    change = index.upsert_endpoints(_slice())
    assert change.endpoints == {WEB} and not change.full
    removed = index.delete_endpoints(_slice().key)
    assert removed.endpoints == {WEB} and not removed.full


def test_port_change_and_deletion_are_full() -> None:
    index = EndpointIndex()
    index.upsert_service(_svc())
    assert index.upsert_service(_svc((("http", 81),))).full == {WEB}
    assert index.delete_service(WEB).full == {WEB}


def test_endpoints_before_their_service_wait_for_it() -> None:
    index = EndpointIndex()
    assert not index.upsert_endpoints(_slice("10.0.0.1"))
    assert index.upsert_service(_svc()).full == {WEB}
    assert [s.key for s in index.endpoint_sets(WEB)] == [_slice().key]


def test_legacy_endpoints_are_used_only_without_slices() -> None:
    index = EndpointIndex()
    index.upsert_service(_svc())
    legacy = parse_endpoints(
        {
            "kind": "Endpoints",
            "metadata": {"name": "web"},
            "subsets": [
                {"addresses": [{"ip": "10.9.9.9"}], "ports": [{"name": "http", "port": 8080}]}
            ],
        }
    )
    index.upsert_endpoints(legacy)
    assert index.endpoint_sets(WEB) == [legacy]
    index.upsert_endpoints(_slice("10.0.0.1"))
    assert index.endpoint_sets(WEB) == [_slice("10.0.0.1")]


def test_replace_all_applies_only_the_difference() -> None:
    index = EndpointIndex()
    other = parse_service(service("other"))
    index.replace_all([_svc(), other], [_slice("10.0.0.1")])
    change = index.replace_all([_svc(), other], [_slice("10.0.0.2")])
    assert change.endpoints == {WEB} and not change.full
    gone = index.replace_all([_svc()], [_slice("10.0.0.2")])
    assert gone.full == {other.key} and not gone.endpoints


def _builder() -> tuple[EndpointIndex, ResourceCache, ClustersAndEndpoints, XdsStats]:
    index, cache, stats = EndpointIndex(), ResourceCache(), XdsStats()
    return index, cache, ClustersAndEndpoints(index, cache, BuildSettings(), stats), stats


def test_endpoint_change_serializes_one_assignment_and_no_cluster() -> None:
    index, _cache, builder, stats = _builder()
    builder.apply(index.replace_all([_svc()], [_slice("10.0.0.1")]))
    stats.reset()
    changed = builder.apply(index.upsert_endpoints(_slice("10.0.0.2")))
    assert changed == {types.ENDPOINT: {cluster_name("web")}}
    assert dict(stats.serializations) == {types.ENDPOINT: 1}


def test_port_change_replaces_cluster_and_assignment_names() -> None:
    index, cache, builder, _ = _builder()
    builder.apply(index.replace_all([_svc()], [_slice("10.0.0.1")]))
    changed = builder.apply(index.upsert_service(_svc((("http", 81),))))
    old, new = cluster_name("web", 80), cluster_name("web", 81)
    assert changed[types.CLUSTER] == {old, new}
    assert cache.get(types.CLUSTER, old, flavor="ads") is None
    assert cache.get(types.CLUSTER, new, flavor="ads") is not None
    assert cache.get(types.ENDPOINT, old) is None and cache.get(types.ENDPOINT, new) is not None


def test_deleted_service_removes_everything_it_had() -> None:
    index, cache, builder, _ = _builder()
    builder.apply(index.replace_all([_svc()], [_slice("10.0.0.1")]))
    builder.apply(index.replace_all([], []))
    for flavor in ("ads", "grpc", "delta_grpc"):
        assert list(cache.names(types.CLUSTER, flavor=flavor)) == []
    assert list(cache.names(types.ENDPOINT)) == []
