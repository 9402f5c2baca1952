"""Which DestinationRule a service's shared clusters follow, and what each change touches.

Pilot builds one set of clusters for every sidecar, so a rule applies only where it
applies to every sidecar: exported to all, from the service's own namespace or the root
one. A rule another namespace's owner writes for someone else's service, or one
exported to fewer namespaces, never changes what every sidecar gets (takeover).
"""

from __future__ import annotations

from typing import Any

from pilot.registry.destination_rule import DestinationRule, parse_destination_rule
from pilot.registry.istio_config import ConfigKey
from pilot.registry.model import ServiceKey
from pilot.registry.traffic_config import TrafficConfig
from pilot.registry.virtual_service import parse_virtual_service

REVIEWS = ServiceKey("default", "reviews")


def rule(
    name: str, namespace: str, host: str, created: str = "2026-01-01T00:00:00Z", **spec: Any
) -> DestinationRule:
    return parse_destination_rule(
        {
            "apiVersion": "networking.istio.io/v1",
            "kind": "DestinationRule",
            "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created},
            "spec": {"host": host, **spec},
        },
        "cluster.local",
    )


def test_another_namespaces_rule_for_my_service_is_held_but_not_applied() -> None:
    store = TrafficConfig()
    store.upsert(rule("evil", "tenant", "reviews.default.svc.cluster.local"))
    assert store.rule_for(REVIEWS) is None
    own = rule("reviews", "default", "reviews")
    store.upsert(own)
    assert store.rule_for(REVIEWS) == own


def test_a_rule_exported_to_fewer_namespaces_is_not_applied_to_shared_clusters() -> None:
    store = TrafficConfig()
    store.upsert(rule("reviews", "default", "reviews", exportTo=["."]))
    assert store.rule_for(REVIEWS) is None


def test_the_oldest_exact_rule_wins_then_wildcards_then_the_root_namespace() -> None:
    store = TrafficConfig()
    mesh = rule("mesh", "istio-system", "*.cluster.local")
    store.upsert(mesh)
    assert store.rule_for(REVIEWS) == mesh
    wild = rule("wild", "default", "*.default.svc.cluster.local")
    store.upsert(wild)
    assert store.rule_for(REVIEWS) == wild
    newer = rule("b", "default", "reviews", created="2026-02-01T00:00:00Z")
    older = rule("z", "default", "reviews", created="2025-02-01T00:00:00Z")
    store.upsert(newer)
    store.upsert(older)
    assert store.rule_for(REVIEWS) == older


def test_a_refused_objects_last_good_version_stays_through_a_reload() -> None:
    store = TrafficConfig()
    good = rule("reviews", "default", "reviews")
    assert store.replace_all([good]) == {"reviews.default.svc.cluster.local"}
    assert store.replace_all([], refused=[good.key]) == set()
    assert store.rule_for(REVIEWS) == good
    assert store.replace_all([]) == {"reviews.default.svc.cluster.local"}
    assert store.rule_for(REVIEWS) is None


def test_unsupported_kinds_are_counted_and_warned_about_once() -> None:
    store = TrafficConfig()
    assert store.upsert_unsupported(ConfigKey("Gateway", "default", "a")) == {"Gateway"}
    assert store.upsert_unsupported(ConfigKey("Gateway", "default", "b")) == set()
    assert store.unsupported_counts() == {"Gateway": 2}
    store.delete(ConfigKey("Gateway", "default", "a"))
    assert store.unsupported_counts() == {"Gateway": 1}


def test_the_services_a_change_touches() -> None:
    store = TrafficConfig()
    services = {REVIEWS, ServiceKey("default", "ratings"), ServiceKey("shop", "cart")}
    hosts = {"reviews.default.svc.cluster.local", "nothing.default.svc.cluster.local"}
    assert store.services_of(hosts, services) == {REVIEWS}
    assert store.services_of({"*.default.svc.cluster.local"}, services) == {
        REVIEWS,
        ServiceKey("default", "ratings"),
    }
    assert store.services_of({"reviews.default"}, services) == set()  # taken as written


def test_a_virtual_service_moves_no_cluster() -> None:
    store = TrafficConfig()
    service = parse_virtual_service(
        {
            "apiVersion": "networking.istio.io/v1",
            "kind": "VirtualService",
            "metadata": {"name": "reviews", "namespace": "default"},
            "spec": {"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "r"}}]}]},
        },
        "cluster.local",
    )
    assert store.upsert(service) == set()
    assert store.virtual_services() == [service]
