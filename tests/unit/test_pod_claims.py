"""Whose pod an endpoint is: its targetRef's, never a Pod's that claims its address.

A service's endpoint at IP X with `targetRef: {kind: Pod, name: reviews-1}` is
reviews-1's: its sidecar decides mTLS, its service account the SANs clients
accept. A Pod of another namespace, or of the same one with a name sorting
first, claiming X changes none of that; a targetRef naming a Pod of another
namespace gives the endpoint no pod (plaintext, no SAN). Without a targetRef, a
pod at X in the set's own namespace is its. Pods and slices arriving in any
order (a slice before its pod, a pod replaced) end in the same answer.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pilot.registry.index import EndpointIndex, IndexChange
from pilot.registry.kubernetes_objects import (
    ObjectError,
    parse_endpoint_slice,
    parse_endpoints,
    parse_pod,
    parse_service,
)
from pilot.registry.model import NO_POD, EndpointSet, Pod, PodKey, ServiceKey
from pilot.sources.file_format import RegistryFileError, parse_registry
from tests.support.endpoint_index import marked
from tests.support.mesh import Ep, as_list, endpoint_slice, pod, service

CLUSTER, OTHER_CLUSTER = "Kubernetes", "west"
NS = "bookinfo"
REVIEWS = ServiceKey(NS, "reviews")
IP = "10.0.0.7"
REAL = "reviews-v1-b2b2b"
REAL_ACCOUNT = (NS, "reviews")


def _slice(*endpoints: Ep, namespace: str = NS, name: str = "reviews-1") -> EndpointSet:
    raw = endpoint_slice("reviews", endpoints, namespace, name=name)
    parsed = parse_endpoint_slice(raw, CLUSTER)
    assert parsed is not None
    return parsed


def _pod(
    name: str,
    ip: str = IP,
    *,
    namespace: str = NS,
    account: str = "reviews",
    sidecar: bool = True,
    cluster: str = CLUSTER,
) -> Pod:
    raw = pod(name, ip, namespace, service_account=account, sidecar=sidecar)
    return parse_pod(raw, cluster)


def _index(*objects: Pod | EndpointSet) -> EndpointIndex:
    index = EndpointIndex(primary=CLUSTER)
    index.upsert_service(parse_service(service("reviews", NS), CLUSTER))
    for obj in objects:
        if isinstance(obj, Pod):
            index.upsert_pod(obj)
        else:
            index.upsert_endpoints(obj)
    return index


def _marked(index: EndpointIndex, ip: str = IP) -> bool:
    """Whether reviews' assignment marks its endpoint at `ip` for mTLS."""
    return marked(index, ip, REVIEWS)


# -- parsing ----------------------------------------------------------------------------


def _raw_slice(target: Any) -> dict[str, Any]:
    raw = endpoint_slice("reviews", [Ep(IP)], NS)
    raw["endpoints"][0]["targetRef"] = target
    return raw


def _pod_name(target: Any) -> str | None:
    parsed = parse_endpoint_slice(_raw_slice(target), CLUSTER)
    assert parsed is not None
    (endpoint,) = parsed.groups[0].endpoints
    return endpoint.pod_name


def test_a_targetref_to_a_pod_of_the_slices_namespace_names_it() -> None:
    assert _pod_name({"kind": "Pod", "namespace": NS, "name": REAL}) == REAL
    assert _pod_name({"kind": "Pod", "name": REAL}) == REAL, "no namespace: the slice's"


def test_a_targetref_to_another_namespaces_pod_names_no_pod() -> None:
    assert _pod_name({"kind": "Pod", "namespace": "attacker", "name": REAL}) == NO_POD


def test_a_targetref_to_another_kind_is_as_if_absent() -> None:
    assert _pod_name({"kind": "WorkloadEntry", "namespace": NS, "name": "vm-1"}) is None
    assert _pod_name(None) is None


@pytest.mark.parametrize(
    ("target", "said"),
    [
        ("reviews", "endpoints[0].targetRef must be a mapping"),
        ({"kind": "Pod", "name": ["x"]}, "endpoints[0].targetRef.name"),
        ({"kind": "Pod", "name": "x", "namespace": 7}, "endpoints[0].targetRef.namespace"),
        ({"kind": "Pod", "name": "Evil\n<b>" + "x" * 100_000}, "targetRef.name is not a valid"),
    ],
)
def test_a_malformed_targetref_is_one_clear_error(target: Any, said: str) -> None:
    with pytest.raises(ObjectError) as error:
        parse_endpoint_slice(_raw_slice(target), CLUSTER)
    message = str(error.value)
    assert said in message and message.startswith(f"EndpointSlice {NS}/reviews-slice")
    assert message.isprintable() and len(message) < 700


def test_legacy_endpoints_keep_their_addresses_targetrefs() -> None:
    raw = {
        "kind": "Endpoints",
        "metadata": {"name": "reviews", "namespace": NS},
        "subsets": [
            {
                "addresses": [{"ip": IP, "targetRef": {"kind": "Pod", "name": REAL}}],
                "notReadyAddresses": [
                    {"ip": "10.0.0.8", "targetRef": {"kind": "Pod", "namespace": "x", "name": "y"}}
                ],
                "ports": [{"name": "http", "port": 8080}],
            }
        ],
    }
    ready, not_ready = parse_endpoints(raw, CLUSTER).groups[0].endpoints
    assert (ready.pod_name, not_ready.pod_name) == (REAL, NO_POD)


def test_the_registry_file_reads_targetrefs_as_kubernetes_objects() -> None:
    text = as_list([service("reviews", NS), endpoint_slice("reviews", [Ep(IP, pod=REAL)], NS)])
    state = parse_registry(text, "mesh.yaml", CLUSTER)
    (endpoint_set,) = state.endpoint_sets
    assert endpoint_set.groups[0].endpoints[0].pod_name == REAL
    bad = as_list([endpoint_slice("reviews", [Ep(IP, pod="NOT A NAME")], NS)])
    with pytest.raises(RegistryFileError, match=r"mesh.yaml: document 1 item 0: .*targetRef"):
        parse_registry(bad, "mesh.yaml", CLUSTER)


def _served(change: IndexChange) -> IndexChange:
    """What a change means for services (full, endpoints), leaving out the sidecars at the
    pod's IPs whose PeerAuthentication selection it re-checks (`workloads`)."""
    return IndexChange(full=change.full, endpoints=change.endpoints)


# -- the index: the rules ------------------------------------------------------------------


def test_an_intruder_of_another_namespace_sorting_first_takes_nothing() -> None:
    """Endpoints with and without a targetRef: a pod of namespace `aaa` at their IP,
    with a sidecar and its own account, is neither endpoint's."""
    for endpoint in (Ep(IP, pod=REAL), Ep(IP)):
        index = _index(_slice(endpoint), _pod(REAL))
        intruder = _pod("aaa-intruder", namespace="aaa", account="intruder")
        assert not _served(index.upsert_pod(intruder)), "nothing served changes"
        assert index.service_accounts(REVIEWS) == {REAL_ACCOUNT}
        assert _marked(index)
        assert not index.delete_pod(PodKey(CLUSTER, NS, REAL)).full - {REVIEWS}
        assert index.service_accounts(REVIEWS) == frozenset(), "the real pod gone: no one's"


def test_an_intruder_of_the_same_namespace_never_overrides_the_targetref() -> None:
    index = _index(_slice(Ep(IP, pod=REAL)), _pod(REAL))
    intruder = _pod("aaa-intruder", account="intruder", sidecar=False)
    assert not _served(index.upsert_pod(intruder)), "nothing served changes"
    assert index.service_accounts(REVIEWS) == {REAL_ACCOUNT}
    assert _marked(index), "the real pod's sidecar, not the intruder's plaintext"
    assert index.pod_for(_slice().key, IP, REAL) == _pod(REAL)


def test_a_targetref_to_another_namespace_gives_the_endpoint_no_pod() -> None:
    raw = endpoint_slice("reviews", [Ep(IP)], NS)
    raw["endpoints"][0]["targetRef"] = {"kind": "Pod", "namespace": "attacker", "name": "evil"}
    foreign = parse_endpoint_slice(raw, CLUSTER)
    assert foreign is not None
    index = _index(
        foreign,
        _pod("evil", namespace="attacker", account="evil"),
        _pod("evil", account="evil"),  # the same name in the slice's namespace, at the IP
    )
    assert index.service_accounts(REVIEWS) == frozenset(), "no SAN added"
    assert not _marked(index), "plaintext"


def test_a_targetref_to_a_pod_that_holds_another_ip_gives_no_pod() -> None:
    index = _index(_slice(Ep(IP, pod=REAL)), _pod(REAL, "10.0.0.99"))
    assert index.service_accounts(REVIEWS) == frozenset() and not _marked(index)
    change = index.upsert_pod(_pod(REAL))  # its IP is now the endpoint's
    assert change.full == {REVIEWS} and index.service_accounts(REVIEWS) == {REAL_ACCOUNT}


def test_a_pod_of_another_cluster_is_never_the_targetrefs() -> None:
    index = _index(_slice(Ep(IP, pod=REAL)), _pod(REAL, account="west", cluster=OTHER_CLUSTER))
    assert index.service_accounts(REVIEWS) == frozenset() and not _marked(index)


def test_without_a_targetref_the_first_pod_of_the_sets_namespace_by_name() -> None:
    index = _index(
        _slice(Ep(IP)),
        _pod("reviews-b", account="b"),
        _pod("reviews-a", account="a", sidecar=False),
        _pod("aaa", namespace="aaa", account="intruder"),
    )
    assert index.service_accounts(REVIEWS) == {(NS, "a")} and not _marked(index)


def test_the_named_pods_sidecar_turning_on_is_an_endpoint_change_only() -> None:
    index = _index(_slice(Ep(IP, pod=REAL)), _pod(REAL, sidecar=False))
    change = index.upsert_pod(_pod(REAL))
    assert _served(change) == IndexChange(endpoints=frozenset({REVIEWS})) and _marked(index)


def test_a_slice_naming_its_pod_before_the_pod_arrives_takes_it_then() -> None:
    index = _index(_slice(Ep(IP, pod=REAL)))
    assert index.service_accounts(REVIEWS) == frozenset() and not _marked(index)
    assert _served(index.upsert_pod(_pod("aaa-intruder", account="intruder"))) == IndexChange()
    change = index.upsert_pod(_pod(REAL))
    assert change.full == {REVIEWS} and index.service_accounts(REVIEWS) == {REAL_ACCOUNT}


# -- the index: any order, the same answer -----------------------------------------------

POD_NAMES = ("aaa", REAL, "zzz")
NAMESPACES = (NS, "aaa")
IPS = ("10.0.0.7", "10.0.0.8")
ACCOUNTS = ("reviews", "intruder")

pods_st = st.builds(
    _pod,
    st.sampled_from(POD_NAMES),
    ip=st.sampled_from(IPS),
    namespace=st.sampled_from(NAMESPACES),
    account=st.sampled_from(ACCOUNTS),
    sidecar=st.booleans(),
    cluster=st.sampled_from((CLUSTER, OTHER_CLUSTER)),
)


def _endpoint(ip: str, target: str | None) -> Ep:
    return Ep(ip, pod=target or "")


endpoints_st = st.lists(
    st.builds(_endpoint, st.sampled_from(IPS), st.sampled_from((None, *POD_NAMES))), max_size=3
)
slices_st = st.builds(
    lambda eps, name: _slice(*eps, name=name), endpoints_st, st.sampled_from(("s-1", "s-2"))
)


def _expected(pods: dict[PodKey, Pod], sets: dict[Any, EndpointSet]) -> tuple[Any, Any]:
    """The rules, recomputed from scratch: reviews' accounts and marked (set, ip) pairs."""
    accounts, marks = set(), {}
    for endpoint_set in sets.values():
        key = endpoint_set.key
        for endpoint in endpoint_set.groups[0].endpoints:
            (ip,) = endpoint.addresses
            if endpoint.pod_name is None:
                here = sorted(
                    k for k, p in pods.items() if (k.cluster, k.namespace) == (CLUSTER, NS)
                    and ip in p.ips
                )  # fmt: skip
                chosen = pods[here[0]] if here else None
            else:
                chosen = pods.get(PodKey(CLUSTER, NS, endpoint.pod_name))
                chosen = chosen if chosen is not None and ip in chosen.ips else None
            marks[key.name, ip, endpoint.pod_name] = chosen is not None and chosen.istio_mtls
            if chosen is not None:
                accounts.add((chosen.key.namespace, chosen.service_account))
    return frozenset(accounts), marks


def _observed(index: EndpointIndex) -> tuple[Any, Any]:
    marks = {
        (s.key.name, ip, e.pod_name): index.runs_sidecar(s.key, e, ip)
        for s in index.endpoint_sets(REVIEWS)
        for e in s.groups[0].endpoints
        for ip in e.addresses
    }
    return index.service_accounts(REVIEWS), marks


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(pods_st, slices_st), max_size=14), st.randoms(use_true_random=False))
def test_pods_and_slices_in_any_order_end_in_the_same_answer(
    objects: list[Pod | EndpointSet], rng: Any
) -> None:
    """Applied in order, and again shuffled with some of them deleted and put back (a pod
    replaced, a slice rewritten): every step's change says what moved, and both orders
    end where the rules say."""
    index = _index()
    pods: dict[PodKey, Pod] = {}
    sets: dict[Any, EndpointSet] = {}
    steps = list(objects)
    steps += [("delete", obj) for obj in rng.sample(objects, len(objects) // 2)]
    steps += rng.sample(objects, len(objects))  # everything once more, shuffled
    for step in steps:
        before = _observed(index)
        if isinstance(step, tuple):
            obj = step[1]
            if isinstance(obj, Pod):
                pods.pop(obj.key, None)
                change = index.delete_pod(obj.key)
            else:
                sets.pop(obj.key, None)
                change = index.delete_endpoints(obj.key)
        elif isinstance(step, Pod):
            pods[step.key] = step
            change = index.upsert_pod(step)
        else:
            sets[step.key] = step
            change = index.upsert_endpoints(step)
        now = _observed(index)
        assert now == _expected(pods, sets)
        if now[0] != before[0]:
            assert REVIEWS in change.full, "a new set of accounts is a full change"
        if now[1] != before[1]:
            assert REVIEWS in change.endpoints, "a changed mTLS mark is pushed"
        if isinstance(step, Pod) and now == before:
            assert not _served(change), "a pod change that moves nothing served is no change"
    held = [*pods.values(), *sets.values()]
    for order in (held, held[::-1]):
        assert _observed(_index(*order)) == _observed(index), "any order: the same answer"
