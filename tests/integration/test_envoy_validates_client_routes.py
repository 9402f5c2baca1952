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

from envoy.config.core.v3 import address_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pilot.builders.listeners import route_filters, router_filter
from pilot.xds import types
from tests.integration.envoy_validation import bootstrap_of
from tests.support.envoy_process import validate_bootstrap
from tests.support.mesh import pod, service
from tests.support.pilot import running_pilot
from tests.support.xds_client import DeltaStream, XdsClient, delta_resources, node

TIMEOUT = 30.0
ROUTE = "9080"
CLIENT_IP = "10.44.0.5"
CLIENT_ID = f"sidecar~{CLIENT_IP}~client.shop~shop.svc.cluster.local"
CLIENT_META = {"NAMESPACE": "shop", "SERVICE_ACCOUNT": "client"}


def host(i: int) -> str:
    return f"svc{i}.shop.svc.cluster.local"


def objects_for(labels: dict[str, str], specs: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """The client's Pod with `labels`; per (namespace, spec) a service svcI, its subsets and
    a VirtualService written in that namespace for it."""
    objects: list[Any] = [pod("client", CLIENT_IP, "shop", service_account="client")]
    objects[0]["metadata"]["labels"] = labels
    for i, (namespace, spec) in enumerate(specs):
        objects.append(service(f"svc{i}", "shop", [("http", 9080)]))
        subsets = [{"name": v, "labels": {"version": v}} for v in ("v1", "v2", "v3")]
        objects.append(
            {
                "apiVersion": "networking.istio.io/v1",
                "kind": "DestinationRule",
                "metadata": {"name": f"svc{i}", "namespace": "shop"},
                "spec": {"host": f"svc{i}", "subsets": subsets},
            }
        )
        objects.append(
            {
                "apiVersion": "networking.istio.io/v1",
                "kind": "VirtualService",
                "metadata": {"name": f"svc{i}", "namespace": namespace},
                "spec": {"hosts": [host(i)], **spec},
            }
        )
    return objects


async def fetch(stream: DeltaStream, hosts: int) -> dict[str, dict[str, Any]]:
    """Clusters, listeners and route configuration 9080, once every subset cluster is in."""
    held: dict[str, dict[str, Any]] = {t: {} for t in (types.CLUSTER, types.LISTENER, types.ROUTE)}
    wanted = {f"outbound|9080|{v}|{host(i)}" for i in range(hosts) for v in ("v1", "v2", "v3")}
    await stream.subscribe(types.CLUSTER, ["*"])
    await stream.subscribe(types.LISTENER, ["*"])
    await stream.subscribe(types.ROUTE, [ROUTE])
    while not (wanted <= held[types.CLUSTER].keys() and ROUTE in held[types.ROUTE]):
        response = await stream.next_response(TIMEOUT)
        for name, resource in delta_resources(response).items():
            held[response.type_url][name] = resource.message
        await stream.ack(response)
    return held


def inline_listener(config: route_pb2.RouteConfiguration) -> listener_pb2.Listener:
    """The route configuration inline, behind the filters pilot's outbound chains carry."""
    manager = hcm_pb2.HttpConnectionManager(
        stat_prefix="inline", route_config=config, http_filters=[*route_filters(), router_filter()]
    )
    manager.route_config.validate_clusters.value = True
    chain = listener_components_pb2.FilterChain()
    chain.filters.add(name="hcm").typed_config.Pack(manager)
    address = address_pb2.SocketAddress(address="127.0.0.1", port_value=41000)
    return listener_pb2.Listener(
        name="inline-routes",
        address=address_pb2.Address(socket_address=address),
        filter_chains=[chain],
    )


async def validated(
    tmp_path: Path, labels: dict[str, str], specs: list[tuple[str, dict[str, Any]]]
) -> route_pb2.RouteConfiguration:
    """Route configuration 9080 as the client reads it, after Envoy validated it."""
    async with (
        running_pilot(tmp_path, objects_for(labels, specs)) as pilot,
        XdsClient(pilot.grpc_target) as client,
    ):
        held = await fetch(client.delta_ads(node(CLIENT_ID, CLIENT_META)), len(specs))
    routes = dict(held[types.ROUTE])
    held[types.ROUTE] = {}
    bootstrap = bootstrap_of(held)
    bootstrap.static_resources.listeners.append(inline_listener(routes[ROUTE]))
    path = tmp_path / "bootstrap.pb"
    path.write_bytes(bootstrap.SerializeToString())
    validate_bootstrap(path)
    config: route_pb2.RouteConfiguration = routes[ROUTE]
    return config


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
