"""PeerAuthentication per workload and per port: precedence, selection, failing closed.

The store's answer for a workload (mesh, namespace, workload and port levels,
UNSET inheriting, the oldest of several), the hostile objects it refuses, and
what a sidecar's Envoy gets: chains per port in that port's mode, the
proxy's own Pod (of its proven namespace) deciding which workload policy
applies, and the strictest modes when its Pod is not known.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from pilot.registry.index import EndpointIndex
from pilot.registry.kubernetes_objects import parse_pod
from pilot.registry.model import Pod, PodKey
from pilot.registry.peer_authentication import (
    MAX_PORT_LEVEL_MTLS,
    MtlsMode,
    PeerAuthenticationKey,
    PeerAuthentications,
    PolicyError,
    parse_peer_authentication,
)
from pilot.sources.file_format import RegistryFileError, parse_registry
from pilot.xds.proxy import ProxyKey
from tests.unit.inbound_mesh import Mesh, chains, mesh, reviews, sidecar

P, S, D, U = "PERMISSIVE", "STRICT", "DISABLE", "UNSET"
REVIEWS = {"app": "reviews", "version": "v1"}


def policy(
    namespace: str,
    mode: str = S,
    name: str = "default",
    selector: dict[str, str] | None = None,
    ports: dict[Any, str] | None = None,
    *,
    created: str = "",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"mtls": {"mode": mode}}
    if selector is not None:
        spec["selector"] = {"matchLabels": selector}
    if ports is not None:
        spec["portLevelMtls"] = {port: {"mode": m} for port, m in ports.items()}
    meta = {"name": name, "namespace": namespace}
    if created:
        meta["creationTimestamp"] = created
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "PeerAuthentication",
        "metadata": meta,
        "spec": spec,
    }


def store_of(*objects: dict[str, Any]) -> PeerAuthentications:
    store = PeerAuthentications()
    store.replace_all(parse_peer_authentication(obj) for obj in objects)
    return store


# Each row: (mesh, namespace, workload) as (mode, {port: mode}) or None (no such policy),
# then what the reviews pod gets: its own mode, port 8080's, port 9090's.
Level = tuple[str, dict[int, str]] | None
PRECEDENCE: list[tuple[Level, Level, Level, tuple[str, str, str]]] = [
    (None, None, None, (P, P, P)),
    ((S, {}), None, None, (S, S, S)),
    ((S, {}), (D, {}), None, (D, D, D)),
    ((S, {}), (U, {}), None, (S, S, S)),
    ((D, {}), (U, {}), (U, {}), (D, D, D)),
    (None, (P, {}), (S, {}), (S, S, S)),
    (None, (S, {}), (P, {}), (P, P, P)),
    (None, (S, {}), (U, {8080: P}), (S, P, S)),
    (None, (P, {}), (U, {8080: S}), (P, S, P)),
    (None, (P, {}), (S, {8080: U}), (S, S, S)),
    (None, (S, {8080: P}), None, (S, P, S)),
    (None, (S, {8080: P}), (U, {}), (S, P, S)),
    (None, (S, {8080: P}), (S, {}), (S, S, S)),
    ((S, {9090: D}), (U, {}), None, (S, S, D)),
    ((S, {9090: D}), (P, {}), None, (P, P, P)),
    ((P, {}), (U, {8080: S}), (U, {9090: S}), (P, S, S)),
]


@pytest.mark.parametrize(("mesh_level", "namespace_level", "workload_level", "want"), PRECEDENCE)
def test_workload_over_namespace_over_mesh_port_over_level_unset_inherits(
    mesh_level: Level, namespace_level: Level, workload_level: Level, want: tuple[str, str, str]
) -> None:
    objects = []
    if mesh_level is not None:
        objects.append(policy("istio-system", mesh_level[0], ports=mesh_level[1]))
    if namespace_level is not None:
        objects.append(policy("shop", namespace_level[0], ports=namespace_level[1]))
    if workload_level is not None:
        mode, ports = workload_level
        objects.append(policy("shop", mode, "reviews", {"app": "reviews"}, ports))
    modes = store_of(*objects).modes_for("shop", [REVIEWS])
    assert (modes.mode.value, modes.at(8080).value, modes.at(9090).value) == want
    assert not modes.uncertain


def test_the_oldest_workload_policy_selecting_a_pod_wins_then_by_name() -> None:
    old = policy("shop", D, "z-old", {"app": "reviews"}, created="2026-01-01T00:00:00Z")
    young = policy("shop", S, "a-young", {"version": "v1"}, created="2026-03-01T00:00:00Z")
    store = store_of(young, old)
    assert store.modes_for("shop", [REVIEWS]).mode is MtlsMode.DISABLE
    assert store.modes_for("shop", [{"version": "v1"}]).mode is MtlsMode.STRICT, "only it"
    tie_a = policy("shop", S, "a", {"app": "reviews"})
    tie_b = policy("shop", D, "b", {"app": "reviews"})
    assert store_of(tie_b, tie_a).modes_for("shop", [REVIEWS]).mode is MtlsMode.STRICT


def test_a_selector_matches_a_subset_of_the_pods_labels_in_its_own_namespace() -> None:
    store = store_of(policy("shop", S, "r", {"app": "reviews", "version": "v1"}))
    assert store.modes_for("shop", [{**REVIEWS, "extra": "x"}]).mode is MtlsMode.STRICT
    assert store.modes_for("shop", [{"app": "reviews"}]).mode is MtlsMode.PERMISSIVE
    assert store.modes_for("shop", [{"app": "reviews", "version": "v2"}]).mode is (
        MtlsMode.PERMISSIVE
    )
    assert store.modes_for("cart", [REVIEWS]).mode is MtlsMode.PERMISSIVE, "not another ns's"


def test_a_selector_in_the_root_namespace_selects_in_every_namespace_below_their_own() -> None:
    mesh_wide = policy("istio-system", S, "reviews-everywhere", {"app": "reviews"})
    store = store_of(mesh_wide, policy("shop", P))
    assert store.modes_for("shop", [REVIEWS]).mode is MtlsMode.STRICT
    assert store.modes_for("shop", [{"app": "cart"}]).mode is MtlsMode.PERMISSIVE
    own = policy("shop", D, "own", {"version": "v1"}, created="2027-01-01T00:00:00Z")
    store = store_of(mesh_wide, own)
    assert store.modes_for("shop", [REVIEWS]).mode is MtlsMode.DISABLE, "its namespace's own"


def test_a_pod_not_known_gets_the_strictest_any_workload_policy_could_give() -> None:
    store = store_of(
        policy("shop", P),
        policy("shop", U, "r", {"app": "reviews"}, {8080: S}),
        policy("shop", D, "d", {"app": "details"}, {9090: P}),
    )
    unknown = store.modes_for("shop", [])
    assert unknown.uncertain
    assert (unknown.mode, unknown.at(8080), unknown.at(9090)) == (
        MtlsMode.PERMISSIVE,
        MtlsMode.STRICT,
        MtlsMode.PERMISSIVE,
    )
    two = store.modes_for("shop", [REVIEWS, {"app": "details"}])
    assert two.uncertain and two.at(8080) is MtlsMode.STRICT, "two pods claim its IP"
    plain = store_of(policy("shop", D)).modes_for("shop", [])
    assert not plain.uncertain and plain.mode is MtlsMode.DISABLE, "no workload policy there"


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"portLevelMtls": {"abc": {"mode": S}}}, "port 'abc' is not 1..65535"),
        ({"portLevelMtls": {0: {"mode": S}}}, "port 0 is not 1..65535"),
        ({"portLevelMtls": {"70000": {"mode": S}}}, "port '70000' is not 1..65535"),
        ({"portLevelMtls": {"-1": {"mode": S}}}, "is not 1..65535"),
        ({"portLevelMtls": {"٣": {"mode": S}}}, "is not 1..65535"),
        ({"portLevelMtls": {True: {"mode": S}}}, "is not 1..65535"),
        ({"portLevelMtls": {8080: "STRICT"}}, r"portLevelMtls\[8080\] must be a mapping"),
        ({"portLevelMtls": {8080: {"mode": "strict"}}}, "not one of"),
        ({"portLevelMtls": {8080: {"mode": S}, "8080": {"mode": D}}}, "port 8080 twice"),
        ({"portLevelMtls": ["8080"]}, "portLevelMtls must be a mapping"),
        ({"selector": {"matchLabels": {"app": 7}}}, "must map strings"),
        ({"selector": {"matchLabels": {"app": ["x"]}}}, "must map strings"),
        ({"selector": {"matchLabels": {"app": "x" * 400}}}, "overlong"),
        ({"selector": {"matchLabels": {f"k{i}": "v" for i in range(4097)}}}, "at most 4096"),
    ],
)
def test_hostile_ports_and_selectors_are_refused_with_one_line(
    spec: dict[str, Any], says: str
) -> None:
    obj = policy("shop")
    obj["spec"].update(spec)
    with pytest.raises(PolicyError, match=says) as error:
        parse_peer_authentication(obj)
    assert "\n" not in str(error.value) and len(str(error.value)) < 300


def test_more_port_entries_than_ports_are_refused_without_reading_them_all() -> None:
    obj = policy("shop", ports={str(p): S for p in range(1, 70_001)})
    with pytest.raises(PolicyError, match=f"70000 ports .at most {MAX_PORT_LEVEL_MTLS}"):
        parse_peer_authentication(obj)


def test_a_refused_policy_refuses_the_registry_file_naming_it() -> None:
    text = """
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: bad, namespace: shop}
spec: {selector: {matchLabels: {app: reviews}}, portLevelMtls: {abc: {mode: STRICT}}}
"""
    with pytest.raises(RegistryFileError, match="document 1: PeerAuthentication shop/bad"):
        parse_registry(text, "registry.yaml")


def test_the_registry_file_feeds_workload_and_port_level_policies() -> None:
    text = """
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: reviews, namespace: shop}
spec:
  selector: {matchLabels: {app: reviews}}
  mtls: {mode: STRICT}
  portLevelMtls: {8080: {mode: PERMISSIVE}, "9090": {mode: DISABLE}}
"""
    [parsed] = parse_registry(text, "registry.yaml").peer_authentications
    assert parsed.selector == (("app", "reviews"),)
    assert parsed.ports == ((8080, MtlsMode.PERMISSIVE), (9090, MtlsMode.DISABLE))


def pod_object(namespace: str, name: str, ip: str, labels: Any) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {},
        "status": {"phase": "Running", "podIP": ip},
    }


def test_a_pods_labels_are_kept_and_garbage_labels_leave_its_workload_unknown() -> None:
    index = EndpointIndex()
    index.upsert_pod(parse_pod(pod_object("shop", "r-1", "10.1.0.1", REVIEWS), "c1"))
    assert index.pod_labels_in("shop", "10.1.0.1") == [REVIEWS]
    for garbage in ({"app": 3}, {"app": "x" * 400}, {f"k{i}": "v" for i in range(65)}):
        pod = parse_pod(pod_object("shop", "r-1", "10.1.0.1", garbage), "c1")
        assert pod.ips == ("10.1.0.1",), "the pod stays, for auto mTLS"
        index.upsert_pod(pod)
        assert index.pod_labels_in("shop", "10.1.0.1") == [], "unknown: fails closed"


def test_only_pods_of_the_namespace_asked_are_a_sidecars_own() -> None:
    index = EndpointIndex()
    index.upsert_pod(Pod(PodKey("c1", "evil", "a"), ("10.1.0.1",), labels=(("app", "x"),)))
    assert index.pod_labels_in("shop", "10.1.0.1") == []
    index.upsert_pod(Pod(PodKey("c2", "shop", "r"), ("10.1.0.1",), labels=(("app", "r"),)))
    assert index.pod_labels_in("shop", "10.1.0.1") == [{"app": "r"}]


# -- what Envoy gets ---------------------------------------------------------------


def pod(m: Mesh, ip: str, labels: dict[str, str], name: str = "", namespace: str = "shop") -> None:
    key = PodKey("", namespace, name or f"pod-{ip}")
    m.updater.upsert_pod(Pod(key, (ip,), istio_mtls=True, labels=tuple(sorted(labels.items()))))


def apply(m: Mesh, obj: dict[str, Any]) -> None:
    m.updater.upsert_peer_authentication(parse_peer_authentication(obj))
    m.flush()


def plaintext_ports(names: list[str]) -> set[str]:
    return {n.removesuffix("-plaintext") for n in names if not n.endswith(("-mtls", "-blackhole"))}


def test_a_workload_policy_makes_its_pod_strict_and_no_other_pod_hears_of_it() -> None:
    with mesh() as m:
        reviews(m, ["10.1.0.1", "10.1.0.2"])
        pod(m, "10.1.0.1", REVIEWS)
        pod(m, "10.1.0.2", {"app": "reviews", "version": "v2"})
        m.flush()
        v1, v2 = m.connect(sidecar("10.1.0.1")), m.connect(sidecar("10.1.0.2"))
        apply(m, policy("shop", S, "v1-strict", {"version": "v1"}))
        assert v1.notified == ["lds"] and v2.notified == []
        m.take(v1)
        assert plaintext_ports(chains(v1)) == set(), "no plaintext chain, passthrough included"
        assert "inbound|8080||-mtls" in chains(v1)
        assert "inbound|8080||" in plaintext_ports(chains(v2)), "v2 still takes plaintext"


def test_port_level_modes_give_each_port_its_own_chains_and_unnamed_ports_passthrough() -> None:
    with mesh() as m:
        reviews(m)  # target ports 8080 (http), 9090 (grpc), 5432 (tcp)
        pod(m, "10.1.0.1", REVIEWS)
        m.flush()
        proxy = m.connect(sidecar("10.1.0.1"))
        apply(m, policy("shop", S, ports={8080: P, 7070: P}))
        m.take(proxy)
        assert plaintext_ports(chains(proxy)) == {"inbound|8080||", "virtualInbound|7070"}
        assert "virtualInbound|7070-mtls" in chains(proxy), "a port no service names"
        apply(m, policy("shop", P, "reverse", {"app": "reviews"}, {9090: S}))
        m.take(proxy)
        opened = plaintext_ports(chains(proxy))
        assert "inbound|9090||" not in opened and "inbound|5432||" in opened
        assert "virtualInbound" in opened, "the workload's own mode: PERMISSIVE"


def test_a_pod_relabelled_or_arriving_repushes_its_own_sidecar_only() -> None:
    with mesh() as m:
        reviews(m, ["10.1.0.1", "10.1.0.2"])
        pod(m, "10.1.0.2", {"app": "other"})
        apply(m, policy("shop", S, "r", {"app": "reviews"}, created="2026-01-01T00:00:00Z"))
        apply(m, policy("shop", P, "o", {"app": "other"}, created="2026-01-01T00:00:00Z"))
        a, b = m.connect(sidecar("10.1.0.1")), m.connect(sidecar("10.1.0.2"))
        assert plaintext_ports(chains(a)) == set(), "its Pod unknown: strictest"
        pod(m, "10.1.0.1", {"app": "other"})
        m.flush()
        assert a.notified == ["lds"] and b.notified == []
        m.take(a)
        assert "inbound|8080||" in plaintext_ports(chains(a))
        pod(m, "10.1.0.1", {"app": "reviews"})
        m.flush()
        m.take(a)
        assert plaintext_ports(chains(a)) == set() and b.notified == []


def test_failing_closed_is_counted_and_said_once_per_sidecar_on_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with mesh() as m:
        namespace = "shop\nWARNING forged"
        reviews(m)
        apply(m, policy(namespace, S, "r", {"app": "reviews"}))
        with caplog.at_level(logging.WARNING, "pilot.xds"):
            first = m.connect(sidecar("10.1.0.1", namespace))
            another = f"sidecar~10.1.0.1~again.{namespace}~{namespace}.svc.cluster.local"
            m.connect(ProxyKey(another, None))
        assert m.inbound.failed_closed == 2
        [line] = [r.getMessage() for r in caplog.records]
        assert "\n" not in line and "strictest" in line
        # Its namespace has no Service at its IP: the passthrough chains say its mode.
        assert "virtualInbound" not in chains(first), "no plaintext while unsure"
        m.updater.delete_peer_authentication(PeerAuthenticationKey(namespace, "r"))
        m.flush()
        m.take(first)
        assert "virtualInbound" in chains(first), "nothing to fear now"
