"""Which DestinationRule a service's clusters follow, and what each change touches.

The shared clusters take a rule only where it applies to every sidecar: exported to
all, from the service's own namespace or the root one. A rule another namespace's owner
writes for someone else's service, or one exported to fewer namespaces, never changes
what every sidecar gets (takeover); it applies to the sidecars of the namespaces that
see it, in Istio's order (their own namespace's, then the service's, then the root's).
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


def test_a_client_namespace_follows_its_own_rule_then_the_services_then_the_roots() -> None:
    store = TrafficConfig()
    root = rule("root", "istio-system", "*.cluster.local", exportTo=["front"])
    store.upsert(root)
    assert store.rule_for(REVIEWS, "front") == root
    assert store.rule_for(REVIEWS) is None
    assert store.rule_for(REVIEWS, "web") is None
    named = rule("named", "default", "reviews", exportTo=["front"])
    store.upsert(named)
    assert store.rule_for(REVIEWS, "front") == named
    own = rule("own", "front", "reviews.default.svc.cluster.local", exportTo=["."])
    store.upsert(own)
    assert store.rule_for(REVIEWS, "front") == own
    assert store.rule_for(REVIEWS, "web") is None
    assert store.rule_for(REVIEWS, "default") is None  # `named` is exported to front alone
    assert store.client_namespaces() == {"istio-system", "default", "front"}
    assert store.differing("front", {REVIEWS}) == {REVIEWS}
    assert store.differing("web", {REVIEWS}) == set()


def test_a_private_rule_applies_in_its_own_namespace_and_a_public_one_differs_nowhere() -> None:
    store = TrafficConfig()
    public = rule("public", "default", "reviews")
    private = rule("private", "default", "reviews", created="2027-01-01T00:00:00Z", exportTo=["."])
    store.upsert(public)
    store.upsert(private)
    assert store.rule_for(REVIEWS, "default") == public  # the oldest of the namespace's
    assert store.differing("default", {REVIEWS}) == set()
    store.delete(public.key)
    assert store.rule_for(REVIEWS, "default") == private
    assert store.differing("default", {REVIEWS}) == {REVIEWS}
    assert store.rule_for(REVIEWS, "front") is None


def test_a_rule_exported_to_a_namespace_that_is_not_its_own_does_not_apply_there() -> None:
    store = TrafficConfig()
    store.upsert(rule("away", "front", "reviews.default.svc.cluster.local", exportTo=["web"]))
    assert store.rule_for(REVIEWS, "front") is None
    assert store.rule_for(REVIEWS, "web") is None  # neither front nor the service's namespace


def test_a_change_of_the_rules_and_only_of_them_moves_their_generation() -> None:
    store = TrafficConfig()
    before = store.rules_generation
    store.upsert(
        parse_virtual_service(
            {
                "apiVersion": "networking.istio.io/v1",
                "kind": "VirtualService",
                "metadata": {"name": "r", "namespace": "default"},
                "spec": {
                    "hosts": ["reviews"],
                    "http": [{"route": [{"destination": {"host": "reviews"}}]}],
                },
            },
            "cluster.local",
        )
    )
    assert store.rules_generation == before
    store.upsert(rule("r", "front", "reviews.default.svc.cluster.local"))
    assert store.rules_generation == before + 1
