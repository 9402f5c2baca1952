"""Envoy accepts the route configurations built for one client, hostile objects included.

A sidecar (node metadata NAMESPACE shop, SERVICE_ACCOUNT client: its identity under
`--xds-auth none`) whose Pod in the registry file carries fuzzed labels, odd characters
among them, reads route configuration 9080 made by fuzzed VirtualServices for svc0..svcN
(namespace shop, subsets v1..v3): `exportTo` of every kind, written in shop or in
another namespace, matches with `sourceLabels` (its Pod's, some of them, others) and
`sourceNamespace`. What it reads goes inline into a bootstrap behind the filters pilot's
outbound chains carry, with `validate_clusters` on, which `envoy --mode validate` must
accept; and a route whose only match selects the sidecar by its Pod's labels reaches it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from envoy.config.route.v3 import route_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.route_validation import host, routed_service
from tests.integration.route_validation import validated as validated_for
from tests.support.mesh import pod
from tests.support.xds_client import node

CLIENT_IP = "10.44.0.5"
CLIENT_ID = f"sidecar~{CLIENT_IP}~client.shop~shop.svc.cluster.local"
CLIENT_META = {"NAMESPACE": "shop", "SERVICE_ACCOUNT": "client"}


def objects_for(labels: dict[str, str], specs: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """The client's Pod with `labels`; per (namespace, spec) a service svcI, its subsets and
    a VirtualService written in that namespace for it."""
    objects: list[Any] = [pod("client", CLIENT_IP, "shop", service_account="client")]
    objects[0]["metadata"]["labels"] = labels
    for i, (namespace, spec) in enumerate(specs):
        objects += routed_service(i, spec, namespace, host(i))
    return objects


async def validated(
    tmp_path: Path, labels: dict[str, str], specs: list[tuple[str, dict[str, Any]]]
) -> route_pb2.RouteConfiguration:
    """Route configuration 9080 as the client reads it, after Envoy validated it."""
    client = node(CLIENT_ID, CLIENT_META)
    return await validated_for(tmp_path, objects_for(labels, specs), len(specs), client)


# Label keys and values, now and then odd (Kubernetes would refuse some; pilot's file
# source keeps what is a string).
_label_text = st.one_of(
    st.sampled_from(["app", "tester", "version", "v1", "a.b/c", "x-y_z"]),
    st.sampled_from(["", "é", "<script>", "a b", "%2F", "%%", "k" * 63]),
    st.text(max_size=8),
)
_labels = st.dictionaries(_label_text, _label_text, max_size=4)
_namespace = st.sampled_from(["shop", "other", "front"])
_export = st.sampled_from([None, ["*"], ["."], ["shop"], ["other"], [".", "front"], ["Bad NS"]])


@st.composite
def _client_and_specs(draw: Any) -> tuple[dict[str, str], list[tuple[str, dict[str, Any]]]]:
    labels = draw(_labels)
    own = st.sampled_from(sorted(labels.items())) if labels else st.just(("app", "tester"))
    selector = st.one_of(
        st.lists(own, max_size=2).map(dict),
        st.dictionaries(_label_text, _label_text, min_size=1, max_size=2),
    )
    match = st.fixed_dictionaries(
        {},
        optional={
            "sourceLabels": selector,
            "sourceNamespace": st.sampled_from(["shop", "other", "Bad", ""]),
            "uri": st.fixed_dictionaries({"prefix": st.sampled_from(["/", "/a"])}),
        },
    )
    route = st.fixed_dictionaries(
        {"route": st.lists(_destination, min_size=1, max_size=2)},
        optional={"match": st.lists(match, max_size=3)},
    )
    specs = []
    for _ in range(draw(st.integers(1, 6))):
        spec: dict[str, Any] = {"http": draw(st.lists(route, min_size=1, max_size=3))}
        exported = draw(_export)
        if exported is not None:
            spec["exportTo"] = exported
        specs.append((draw(_namespace), spec))
    return labels, specs


_destination = st.fixed_dictionaries(
    {
        "destination": st.fixed_dictionaries(
            {"host": st.just("svc0.shop.svc.cluster.local")},
            optional={"subset": st.sampled_from(["v1", "v2", "v3"])},
        ),
        "weight": st.integers(0, 100),
    }
)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(drawn=_client_and_specs())
def test_envoy_validates_fuzzed_client_dependent_routes(
    tmp_path_factory: Any, drawn: tuple[dict[str, str], list[Any]]
) -> None:
    labels, specs = drawn
    asyncio.run(validated(tmp_path_factory.mktemp("fuzz"), labels, specs))


async def test_a_selector_of_the_pods_odd_labels_reaches_it(tmp_path: Path) -> None:
    labels = {"app": "tester", "a.b/c": "<script>é%2F", "k" * 63: ""}
    to = {"destination": {"host": host(0), "subset": "v3"}}
    spec = {
        "http": [
            {"name": "odd", "match": [{"sourceLabels": dict(list(labels.items())[1:])}],
             "route": [to]},
            {"name": "other", "match": [{"sourceLabels": {"a.b/c": "<script>"}}], "route": [to]},
        ]
    }  # fmt: skip
    config = await validated(tmp_path, labels, [("shop", spec)])
    [vhost] = [h for h in config.virtual_hosts if h.name == f"{host(0)}:9080"]
    assert [r.name for r in vhost.routes] == ["odd"]
