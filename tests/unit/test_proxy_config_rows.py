"""The rows of `pilot proxy-config`, from CSDS answers built here.

What the real command shows against a real pilot and Envoy is in
tests/integration/test_proxy_config.py; here are the cases a live mesh does not
make on demand: a secret that still carries its private key (the rows must not
show it even then), several identities behind one node id, localities with and
without a region, resources CSDS sent no contents for.
"""

from __future__ import annotations

import datetime
import json

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.config.route.v3 import route_components_pb2 as rc_pb2
from envoy.config.route.v3 import route_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.filters.network.tcp_proxy.v3 import tcp_proxy_pb2
from envoy.extensions.transport_sockets.tls.v3 import secret_pb2
from envoy.service.status.v3 import csds_pb2
from google.protobuf import any_pb2
from google.protobuf.message import Message

from pilot.builders.inbound import VIRTUAL_INBOUND, InboundProtocol, InboundShape, virtual_inbound
from pilot.builders.virtual_routes import envoy_routes
from pilot.debug import proxy_config, routing_rows
from pilot.debug.tables import CELL_CHARS, FORMATS, formatted
from pilot.registry.authorization_policy import (
    AppliedPolicies,
    AuthorizationPolicy,
    parse_authorization_policy,
)
from pilot.registry.peer_authentication import MtlsMode
from pilot.registry.virtual_service import parse_virtual_service
from pilot.xds import types
from tests.support.ca import issue_leaf, new_ca

URI = "spiffe://cluster.local/ns/shop/sa/cart"


def _config(node_id: str = "n", scope: str = "") -> csds_pb2.ClientConfig:
    config = csds_pb2.ClientConfig(client_scope=scope)
    config.node.id = node_id
    return config


def _add(config: csds_pb2.ClientConfig, type_url: str, name: str, resource: object | None) -> None:
    generic = config.generic_xds_configs.add(
        type_url=type_url, name=name, version_info="v1", config_status=csds_pb2.SYNCED
    )
    if resource is not None:
        generic.xds_config.Pack(resource)


def test_a_secret_with_its_key_shows_the_certificate_and_never_the_key() -> None:
    ca = new_ca("root")
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = issue_leaf(ca, key.public_key(), [URI])
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    secret = secret_pb2.Secret(name="default")
    secret.tls_certificate.certificate_chain.inline_bytes = leaf.public_bytes(
        serialization.Encoding.PEM
    )
    secret.tls_certificate.private_key.inline_bytes = key_pem
    config = _config()
    _add(config, types.SECRET, "default", secret)

    table = proxy_config.secrets(config)
    [record] = table.listed()
    assert record["san"] == URI
    assert record["serial_number"] == format(leaf.serial_number, "x")
    assert record["valid_cert"] is True
    body = b"".join(key_pem.splitlines()[1:-1]).decode()  # the key's base64, without PEM lines
    for output in FORMATS:
        text = formatted(table, output)
        assert "PRIVATE KEY" not in text and body[:32] not in text, f"{output} shows the key"


def test_a_resource_without_contents_is_a_row_of_its_state() -> None:
    config = _config()
    _add(config, types.SECRET, "default", None)
    _add(config, types.CLUSTER, "outbound|80||a.default.svc.cluster.local", None)
    [secret] = proxy_config.secrets(config).listed()
    assert secret["resource_name"] == "default" and secret["status"] == "SYNCED"
    assert secret["san"] is None and secret["serial_number"] is None
    [cluster] = proxy_config.clusters(config).listed()
    assert (cluster["type"], cluster["lb"], cluster["version"]) == (None, None, "v1")
    assert proxy_config.endpoints(config).listed() == []


@pytest.mark.parametrize(
    ("region", "zone", "sub_zone", "shown"),
    [
        ("", "", "", None),
        ("", "zone-a", "", "/zone-a"),
        ("r", "z", "", "r/z"),
        ("r", "z", "s", "r/z/s"),
    ],
)
def test_localities_are_written_as_istio_writes_them(
    region: str, zone: str, sub_zone: str, shown: str | None
) -> None:
    assignment = endpoint_pb2.ClusterLoadAssignment(cluster_name="c")
    group = assignment.endpoints.add()
    group.locality.region, group.locality.zone, group.locality.sub_zone = region, zone, sub_zone
    address = group.lb_endpoints.add().endpoint.address.socket_address
    address.address, address.port_value = "10.0.0.1", 8080
    config = _config()
    _add(config, types.ENDPOINT, "c", assignment)
    [record] = proxy_config.endpoints(config).listed()
    assert record == {
        "endpoint": "10.0.0.1:8080",
        "status": "UNKNOWN",
        "cluster": "c",
        "locality": shown,
        "priority": 0,
        "weight": None,
        "error": None,
    }
    assert formatted(proxy_config.endpoints(config), "table").splitlines()[1].split()[-4] == (
        shown or "-"
    )


def test_one_node_id_with_two_identities_needs_one_picked() -> None:
    response = csds_pb2.ClientStatusResponse()
    for scope in ("spiffe://cluster.local/ns/a/sa/x", "spiffe://cluster.local/ns/b/sa/y"):
        response.config.append(_config("shared", scope))
    with pytest.raises(proxy_config.AmbiguousProxy, match="--identity"):
        proxy_config.select(response, "shared")
    picked = proxy_config.select(response, "shared", "spiffe://cluster.local/ns/b/sa/y")
    assert picked.client_scope.endswith("/ns/b/sa/y")
    with pytest.raises(proxy_config.ProxyNotFound):
        proxy_config.select(response, "shared", "spiffe://cluster.local/ns/c/sa/z")
    with pytest.raises(proxy_config.ProxyNotFound):
        proxy_config.select(response, "other")


def test_the_request_names_the_node_exactly_and_wants_contents() -> None:
    request = proxy_config.request_for("sidecar~10.0.0.1~a.b~b.svc.cluster.local")
    [matcher] = request.node_matchers
    assert matcher.node_id.exact == "sidecar~10.0.0.1~a.b~b.svc.cluster.local"
    assert not request.exclude_resource_contents


def test_times_are_utc_seconds() -> None:
    ca = new_ca("root", valid_for=datetime.timedelta(days=1))
    secret = secret_pb2.Secret(name="ROOTCA")
    pem = ca.cert.public_bytes(serialization.Encoding.PEM)
    secret.validation_context.trusted_ca.inline_bytes = pem
    config = _config()
    _add(config, types.SECRET, "ROOTCA", secret)
    [record] = proxy_config.secrets(config).listed()
    assert record["type"] == "CA"
    after = ca.cert.not_valid_after_utc.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert record["not_after"] == after


# --- listeners and routes ----------------------------------------------------------------


def _packed(message: Message) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def _tcp_chain(cluster: str) -> listener_components_pb2.FilterChain:
    proxy = tcp_proxy_pb2.TcpProxy(stat_prefix=cluster, cluster=cluster)
    # A name that says nothing: the rows go by the config's type, as Envoy does.
    return listener_components_pb2.FilterChain(
        filters=[listener_components_pb2.Filter(name="f", typed_config=_packed(proxy))]
    )


def _http_chain(route_config: str) -> listener_components_pb2.FilterChain:
    manager = hcm_pb2.HttpConnectionManager(stat_prefix="s")
    manager.rds.route_config_name = route_config
    return listener_components_pb2.FilterChain(
        filters=[listener_components_pb2.Filter(name="hcm", typed_config=_packed(manager))]
    )


def _listener(name: str, address: str, port: int) -> listener_pb2.Listener:
    listener = listener_pb2.Listener(name=name)
    listener.address.socket_address.address = address
    listener.address.socket_address.port_value = port
    return listener


def _inbound_chain(
    port: int, transport: str, alpn: list[str]
) -> listener_components_pb2.FilterChain:
    chain = _tcp_chain(f"inbound|{port}||")
    chain.filter_chain_match.destination_port.value = port
    chain.filter_chain_match.transport_protocol = transport
    chain.filter_chain_match.application_protocols.extend(alpn)
    return chain


def _sidecar_listeners() -> csds_pb2.ClientConfig:
    """What a captured sidecar holds: virtualOutbound, an HTTP and a TCP port, and a
    virtualInbound with mTLS and plaintext chains per port and a default chain."""
    outbound = _listener("virtualOutbound", "0.0.0.0", 15001)
    outbound.filter_chains.append(_tcp_chain("PassthroughCluster"))
    http = _listener("0.0.0.0_9080", "0.0.0.0", 9080)
    http.filter_chains.append(_http_chain("9080"))
    tcp = _listener("10.96.0.7_5432", "10.96.0.7", 5432)
    tcp.filter_chains.append(_tcp_chain("outbound|5432||db.shop.svc.cluster.local"))
    inbound = _listener("virtualInbound", "0.0.0.0", 15006)
    for port in (9080, 8443):
        inbound.filter_chains.append(_inbound_chain(port, "tls", ["istio-peer-exchange", "istio"]))
        inbound.filter_chains.append(_inbound_chain(port, "raw_buffer", []))
    inbound.default_filter_chain.CopyFrom(_tcp_chain("InboundPassthroughClusterIpv4"))
    config = _config()
    for listener in (inbound, tcp, http, outbound):
        _add(config, types.LISTENER, listener.name, listener)
    _add(config, types.LISTENER, "asked-for-not-sent", None)
    return config


def test_listeners_are_a_row_per_filter_chain_by_port() -> None:
    rows = [
        (r["addresses"], r["port"], r["match"], r["destination"], r["name"])
        for r in proxy_config.listeners(_sidecar_listeners()).listed()
    ]
    inbound = "virtualInbound"
    mtls = "Trans: tls; App: istio-peer-exchange,istio; Addr: *:"
    db = "outbound|5432||db.shop.svc.cluster.local"
    assert rows == [
        ("10.96.0.7", 5432, "ALL", f"Cluster: {db}", "10.96.0.7_5432"),
        ("0.0.0.0", 9080, "ALL", "Route: 9080", "0.0.0.0_9080"),
        ("0.0.0.0", 15001, "ALL", "PassthroughCluster", "virtualOutbound"),
        ("0.0.0.0", 15006, f"{mtls}9080", "Cluster: inbound|9080||", inbound),
        ("0.0.0.0", 15006, "Trans: raw_buffer; Addr: *:9080", "Cluster: inbound|9080||", inbound),
        ("0.0.0.0", 15006, f"{mtls}8443", "Cluster: inbound|8443||", inbound),
        ("0.0.0.0", 15006, "Trans: raw_buffer; Addr: *:8443", "Cluster: inbound|8443||", inbound),
        ("0.0.0.0", 15006, "ALL", "InboundPassthroughClusterIpv4", inbound),
        (None, None, None, None, "asked-for-not-sent"),
    ]
    table = formatted(proxy_config.listeners(_sidecar_listeners()), "table").splitlines()
    assert table[0].split() == [
        "ADDRESSES",
        "PORT",
        "MATCH",
        "DESTINATION",
        "AUTHZ",
        "NAME",
        "STATUS",
        "ERROR",
    ]
    assert table[2].split()[:4] == ["0.0.0.0", "9080", "ALL", "Route:"]


def _authorization_policy(name: str, spec: dict[str, object]) -> AuthorizationPolicy:
    return parse_authorization_policy(
        {
            "apiVersion": "security.istio.io/v1",
            "kind": "AuthorizationPolicy",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": spec,
        }
    )


def test_listeners_say_which_authorization_policies_each_chain_runs() -> None:
    """pilot's own virtualInbound: every chain but the blackhole names the policies."""
    applied = AppliedPolicies(
        (
            _authorization_policy("deny-admin", {"action": "DENY", "rules": [{}]}),
            _authorization_policy("allow-nothing", {}),
        )
    )
    shape = InboundShape(((9080, InboundProtocol.HTTP),), MtlsMode.PERMISSIVE, authz=applied)
    config = _config()
    _add(config, types.LISTENER, VIRTUAL_INBOUND, virtual_inbound(shape))
    rows = proxy_config.listeners(config).listed()
    expected = "DENY shop/deny-admin; ALLOW shop/allow-nothing"
    assert {r["authz"] for r in rows if "BlackHole" not in str(r["destination"])} == {expected}
    assert [r["authz"] for r in rows if "BlackHole" in str(r["destination"])] == [None]
    no_policy = _config()
    plain = InboundShape(((9080, InboundProtocol.HTTP),), MtlsMode.PERMISSIVE)
    _add(no_policy, types.LISTENER, VIRTUAL_INBOUND, virtual_inbound(plain))
    assert {r["authz"] for r in proxy_config.listeners(no_policy).listed()} == {None}


def test_filter_chain_matches_are_worded_as_istioctl_words_them() -> None:
    match = listener_components_pb2.FilterChainMatch(
        server_names=["a.example", "b.example"], transport_protocol="tls"
    )
    match.prefix_ranges.add(address_prefix="10.0.0.0").prefix_len.value = 8
    match.destination_port.value = 443
    assert routing_rows.chain_match(match) == (
        "SNI: a.example,b.example; Trans: tls; Addr: 10.0.0.0/8:443"
    )
    assert routing_rows.chain_match(listener_components_pb2.FilterChainMatch()) == "ALL"
    inline = hcm_pb2.HttpConnectionManager(stat_prefix="s")
    host = inline.route_config.virtual_hosts.add(name="backend", domains=["*"])
    host.routes.add(match=rc_pb2.RouteMatch(prefix="/healthz/ready"))
    chain = listener_components_pb2.FilterChain(
        filters=[listener_components_pb2.Filter(name="x", typed_config=_packed(inline))]
    )
    assert routing_rows.chain_destination(chain) == "Inline Route: /healthz/ready*"
    assert routing_rows.chain_destination(listener_components_pb2.FilterChain()) == (
        "Non-HTTP/Non-TCP"
    )


def _route_config() -> route_pb2.RouteConfiguration:
    config = route_pb2.RouteConfiguration(name="9080")
    fqdn = "reviews.shop.svc.cluster.local"
    bare = [fqdn, "reviews.shop.svc", "reviews.shop", "reviews", "10.96.0.9"]
    host = config.virtual_hosts.add(
        name=f"{fqdn}:9080", domains=[d for b in bare for d in (b, f"{b}:9080")]
    )
    host.routes.add(
        name="default",
        match=rc_pb2.RouteMatch(prefix="/"),
        route=rc_pb2.RouteAction(cluster=f"outbound|9080||{fqdn}"),
    )
    config.virtual_hosts.add(name="allow_any", domains=["*"]).routes.add(
        match=rc_pb2.RouteMatch(prefix="/"), route=rc_pb2.RouteAction(cluster="PassthroughCluster")
    )
    config.virtual_hosts.add(name="block_all", domains=["*"]).routes.add(
        match=rc_pb2.RouteMatch(path="/x"),
        direct_response=rc_pb2.DirectResponseAction(status=502),
    )
    config.virtual_hosts.add(name="empty", domains=["[fd00::1]", "[fd00::1]:80"])
    return config


def test_routes_are_a_row_per_route_with_domains_shortened() -> None:
    config = _config()
    _add(config, types.ROUTE, "9080", _route_config())
    _add(config, types.ROUTE, "80", route_pb2.RouteConfiguration(name="80"))
    _add(config, types.ROUTE, "inbound|8080||", None)
    rows = [
        (
            r["name"],
            r["vhost_name"],
            r["domains"],
            r["match"],
            r["destination"],
            r["retries"],
            r["timeout"],
        )
        for r in proxy_config.routes(config).listed()
    ]
    assert rows == [
        ("80", None, None, None, None, None, None),
        ("9080", "reviews.shop.svc.cluster.local:9080", "reviews.shop, reviews + 1 more...", "/*",
         "Cluster: outbound|9080||reviews.shop.svc.cluster.local", "none", "15s"),
        ("9080", "allow_any", "*", "/*", "PassthroughCluster", "none", "15s"),
        ("9080", "block_all", "*", "/x", "Direct response: 502", None, None),
        ("9080", "empty", "[fd00::1]", "/*", "404", None, None),
        ("inbound|8080||", None, None, None, None, None, None),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("domains", "shown"),
    [
        ([], None),
        (["*"], "*"),
        (["a.ns.svc.example.org", "a.ns.svc", "a.ns"], "a.ns"),
        (["only:80", "ports:80"], "only:80, ports:80"),
        (["a", "b", "c", "d"], "a, b + 2 more..."),
    ],
)
def test_domains_keep_the_short_names(domains: list[str], shown: str | None) -> None:
    assert routing_rows.domains(domains) == shown


HOSTILE = "evil\x1b[2J\x1b]0;owned\x07\nforged row\u202e"


def test_names_reach_a_table_escaped_and_cut_short() -> None:
    listener = _listener(HOSTILE, "0.0.0.0", 1)
    listener.filter_chains.append(_tcp_chain("outbound|1||" + "x" * 5000))
    config = _config(HOSTILE)
    _add(config, types.LISTENER, listener.name, listener)
    text = formatted(proxy_config.listeners(config), "table")
    assert not any(ch in text for ch in "\x1b\x07\u202e"), repr(text)
    assert len(text.splitlines()) == 2, "a newline in a name forged a row"
    assert "evil\\x1b[2J" in text and "(+" in text and len(text) < 2 * CELL_CHARS + 250
    for output in ("json", "yaml"):
        shown = formatted(proxy_config.listeners(config), output)
        assert not any(ch in shown for ch in "\x1b\x07\u202e"), output
        lines = shown.splitlines()
        assert not any(line.lstrip().startswith("forged") for line in lines), output
    records = json.loads(formatted(proxy_config.listeners(config), "json"))
    assert records[0]["name"] == HOSTILE, "-o json keeps the whole value"


def test_an_error_names_a_hostile_node_id_escaped_and_cut_short() -> None:
    with pytest.raises(proxy_config.ProxyNotFound) as raised:
        proxy_config.select(csds_pb2.ClientStatusResponse(), HOSTILE + "y" * 10_000)
    message = str(raised.value)
    assert "\x1b" not in message and "\n" not in message and len(message) < 600, message


def test_route_paths_and_actions_are_worded_as_istioctl_words_them() -> None:
    regex = rc_pb2.RouteMatch()
    regex.safe_regex.regex = "/api/v[0-9]+"
    assert [routing_rows.route_match(m) for m in (regex, rc_pb2.RouteMatch())] == [
        "regex /api/v[0-9]+",
        "",
    ]
    weighted = rc_pb2.Route()
    for name, weight in (("outbound|80|v1|a.ns.svc.cluster.local", 80), ("outbound|80|v2|a", 20)):
        weighted.route.weighted_clusters.clusters.add(name=name).weight.value = weight
    redirect = rc_pb2.Route(redirect=rc_pb2.RedirectAction(host_redirect="x"))
    assert [routing_rows.route_destination(r) for r in (weighted, redirect)] == [
        "Clusters: outbound|80|v1|a.ns.svc.cluster.local=80,outbound|80|v2|a=20",
        "Redirect",
    ]


def test_a_virtual_services_routes_show_their_conditions_weights_timeouts_and_retries() -> None:
    """What `pilot proxy-config routes` says of istio.io's jason route and a 0.5 s timeout."""
    parsed = parse_virtual_service(
        {
            "apiVersion": "networking.istio.io/v1",
            "kind": "VirtualService",
            "metadata": {"name": "reviews", "namespace": "shop"},
            "spec": {
                "hosts": ["reviews"],
                "http": [
                    {"match": [{"headers": {"end-user": {"exact": "jason"}},
                                "queryParams": {"q": {"prefix": "a"}},
                                "withoutHeaders": {"x-skip": {}}}],
                     "route": [{"destination": {"host": "reviews", "subset": "v2"}}],
                     "timeout": "0.5s",
                     "retries": {"attempts": 3, "perTryTimeout": "2s", "retryOn": "503"}},
                    {"route": [{"destination": {"host": "reviews", "subset": "v1"}, "weight": 80},
                               {"destination": {"host": "reviews", "subset": "v3"}, "weight": 20}],
                     "retries": {"attempts": 0}},
                ],
            },
        },
        "cluster.local",
    )  # fmt: skip
    host = rc_pb2.VirtualHost(
        name="reviews:9080",
        routes=envoy_routes(parsed.http, 9080, lambda d: f"outbound|9080|{d.subset}|r"),
    )
    assert list(routing_rows.virtual_host_routes(host)) == [
        ("/* [end-user=jason; !x-skip; ?q^=a]", "Cluster: outbound|9080|v2|r",
         "3 on retriable-status-codes [503]; per try 2s; another host", "0.500s"),
        ("/*", "Clusters: outbound|9080|v1|r=80,outbound|9080|v3|r=20", "none", "none"),
    ]  # fmt: skip


def test_contents_that_do_not_decode_are_a_row_of_name_and_state() -> None:
    config = _config()
    for type_url, name in ((types.LISTENER, "l"), (types.ROUTE, "r")):
        generic = config.generic_xds_configs.add(type_url=type_url, name=name)
        generic.xds_config.type_url = type_url
        generic.xds_config.value = b"\xff\xff\xff"  # not a message: no traceback, no rows made up
    assert proxy_config.listeners(config).listed()[0]["name"] == "l"
    assert [r["match"] for r in proxy_config.listeners(config).listed()] == [None]
    assert [(r["name"], r["vhost_name"]) for r in proxy_config.routes(config).listed()] == [
        ("r", None)
    ]


ISTIO_RETRY_ON = "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes"


def _to_reviews(policy: rc_pb2.RetryPolicy | None = None) -> rc_pb2.Route:
    route = rc_pb2.Route(route=rc_pb2.RouteAction(cluster="outbound|9080||reviews"))
    if policy is not None:
        route.route.retry_policy.CopyFrom(policy)
    return route


def test_retries_are_worded_count_conditions_and_whether_another_host_is_picked() -> None:
    istio = rc_pb2.RetryPolicy(retry_on=ISTIO_RETRY_ON, host_selection_retry_max_attempts=5)
    istio.num_retries.value = 2
    istio.retry_host_predicate.add(name=routing_rows.PREVIOUS_HOSTS)
    written = rc_pb2.RetryPolicy(retry_on="5xx,retriable-status-codes")
    written.num_retries.value = 3
    written.retriable_status_codes.extend([503, 429])
    written.per_try_timeout.FromMilliseconds(2500)
    off = rc_pb2.RetryPolicy(retry_on="5xx")
    off.num_retries.value = 0
    host = rc_pb2.VirtualHost()
    assert [
        routing_rows.route_retries(host, _to_reviews(policy))
        for policy in (istio, written, off, rc_pb2.RetryPolicy(retry_on="5xx"), None)
    ] == [
        f"2 on {ISTIO_RETRY_ON}; another host",
        "3 on 5xx,retriable-status-codes [503,429]; per try 2.500s",
        "none",
        "1 on 5xx",  # Envoy's default count when none is given
        "none",
    ]
    host.retry_policy.CopyFrom(written)
    assert routing_rows.route_retries(host, _to_reviews()).startswith("3 on 5xx"), "the host's"
    assert routing_rows.route_retries(host, _to_reviews(istio)).startswith("2 on"), "the route's"
    answered = rc_pb2.Route(direct_response=rc_pb2.DirectResponseAction(status=502))
    assert routing_rows.route_retries(host, answered) is None


def test_hostile_retry_conditions_reach_a_table_escaped_and_cut_short() -> None:
    """retry_on is a string a control plane chose: the table escapes and bounds it."""
    config_route = route_pb2.RouteConfiguration(name="9080")
    host = config_route.virtual_hosts.add(name="reviews:9080", domains=["reviews"])
    policy = rc_pb2.RetryPolicy(retry_on=HOSTILE + "x" * 5000)
    policy.num_retries.value = 2**32 - 1
    host.routes.append(_to_reviews(policy))
    config = _config()
    _add(config, types.ROUTE, "9080", config_route)
    text = formatted(proxy_config.routes(config), "table")
    assert not any(ch in text for ch in "\x1b\x07\u202e"), repr(text[:300])
    assert len(text.splitlines()) == 2, "a newline in retry_on forged a row"
    assert f"{2**32 - 1} on evil" in text and len(text) < 2 * CELL_CHARS + 400


def test_a_cluster_row_says_how_it_balances() -> None:
    config = _config()
    for name, policy in (("eds", cluster_pb2.Cluster.LEAST_REQUEST),
                         ("orig", cluster_pb2.Cluster.CLUSTER_PROVIDED)):  # fmt: skip
        _add(config, types.CLUSTER, name, cluster_pb2.Cluster(name=name, lb_policy=policy))
    _add(config, types.CLUSTER, "plain", cluster_pb2.Cluster(name="plain"))
    rows = [(r["name"], r["lb"]) for r in proxy_config.clusters(config).listed()]
    assert rows == [
        ("eds", "LEAST_REQUEST"),
        ("orig", "CLUSTER_PROVIDED"),
        ("plain", "ROUND_ROBIN"),
    ]
